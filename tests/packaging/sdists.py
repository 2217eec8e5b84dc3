"""Fetch real host source trees (sdists) from the package index for the doctor's tests.

``vllm-ascend==0.23.0.post1`` and ``vllm-hust==0.17.2.post1`` exist only as sdists, and
``pip download`` fails on them while building metadata.  So we ask pip for its indexes (its
``download`` command's options as pip's own configuration and environment set them: the
index URL and every extra index, no host name written here), read each index's simple page
for the project (PEP 503 links carrying ``#sha256=``) with urllib until one lists the sdist,
download the ``.tar.gz`` itself, verify its sha256 against the index, and cache it under
``~/.cache/vllm-hust-vspec/sdists/``.
Extraction keeps only ``*.py``, ``*.toml``, ``*.cfg`` and ``PKG-INFO`` members (what the
doctor reads), into the same cache.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request

CACHE = pathlib.Path(
    os.environ.get("VSPEC_SDIST_CACHE", os.path.expanduser("~/.cache/vllm-hust-vspec/sdists"))
)


class IndexUnreachable(RuntimeError):
    """No index could be reached (the only reason a test may skip)."""


_PIP_INDEXES = """
import json
from pip._internal.commands import create_command
options, _ = create_command("download").parse_args([])
print(json.dumps([options.index_url, *options.extra_index_urls]))
"""


def pip_indexes() -> list[str]:
    """The simple-index base URLs pip would use (its configuration, environment, defaults)."""
    proc = subprocess.run([sys.executable, "-c", _PIP_INDEXES], capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"cannot read pip's index configuration: {proc.stderr[-500:]}")
    return [u for u in json.loads(proc.stdout) if u]


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _project_page(base: str, name: str) -> tuple[str, str | None]:
    """``(url, page)`` of ``name`` on the simple index ``base``; page None where the index
    does not list the project (HTTP 404, no such file)."""
    url = base.rstrip("/") + f"/{name}/"
    if url.startswith("file:"):
        url += "index.html"
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return url, resp.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return url, None
        if exc.code >= 500:
            raise IndexUnreachable(f"{url}: server error {exc.code}") from exc
        raise RuntimeError(f"{url}: HTTP {exc.code} (the index answered: not a skip)") from exc
    except urllib.error.URLError as exc:
        if url.startswith("file:"):
            return url, None
        raise IndexUnreachable(f"cannot reach {url}: {exc}") from exc
    except (TimeoutError, OSError) as exc:
        raise IndexUnreachable(f"cannot reach {url}: {exc}") from exc


def _sdist_entry(name: str, version: str) -> dict:
    """``{"filename", "url", "digests": {"sha256"}}`` of the sdist, from the first of pip's
    indexes whose simple page lists it."""
    want = f"{name.replace('-', '_')}-{version}.tar.gz"
    asked, unreachable = [], []
    for base in pip_indexes():
        try:
            url, page = _project_page(base, name)
        except IndexUnreachable as exc:
            unreachable.append(str(exc))
            continue
        asked.append(url)
        if page is not None and (entry := _find(page, url, want)) is not None:
            return entry
    if unreachable and not any(asked):
        raise IndexUnreachable("; ".join(unreachable))
    raise RuntimeError(f"no {want} with a sha256 fragment on pip's indexes (asked: "
                       f"{', '.join(asked)}; unreachable: {'; '.join(unreachable) or 'none'})")


def _find(page: str, url: str, want: str) -> dict | None:
    links = _Links()
    links.feed(page)
    for href in links.hrefs:
        target, _, fragment = href.partition("#")
        filename = urllib.parse.unquote(target.rsplit("/", 1)[-1])
        if filename.lower() == want.lower() and fragment.startswith("sha256="):
            return {"filename": filename, "url": urllib.parse.urljoin(url, target),
                    "digests": {"sha256": fragment[len("sha256="):]}}
    return None


def fetch_sdist(name: str, version: str) -> pathlib.Path:
    """Return the cached, sha256-verified sdist of ``name==version`` (downloading it once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    stamp = CACHE / f"{name}-{version}.json"
    if stamp.is_file():
        entry = json.loads(stamp.read_text())
        path = CACHE / entry["filename"]
        if path.is_file() and _sha256(path) == entry["digests"]["sha256"]:
            return path
    entry = _sdist_entry(name, version)
    path = CACHE / entry["filename"]
    if not (path.is_file() and _sha256(path) == entry["digests"]["sha256"]):
        tmp = path.with_suffix(".part")
        try:
            with urllib.request.urlopen(entry["url"], timeout=600) as resp, tmp.open("wb") as out:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise IndexUnreachable(f"cannot download {entry['url']}: {exc}") from exc
        got = _sha256(tmp)
        if got != entry["digests"]["sha256"]:
            tmp.unlink()
            raise RuntimeError(
                f"{entry['filename']}: sha256 {got} != index {entry['digests']['sha256']}"
            )
        tmp.replace(path)
    stamp.write_text(json.dumps({"filename": entry["filename"], "digests": entry["digests"]}))
    return path


_KEEP = (".py", ".toml", ".cfg", "PKG-INFO")


def host_tree(name: str, version: str) -> pathlib.Path:
    """Extract the sdist's Python sources once; return the project root (holds PKG-INFO)."""
    archive = fetch_sdist(name, version)
    dest = CACHE / "trees" / f"{name}-{version}"
    done = dest / ".complete"
    if not done.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:gz") as tar:
            members = [
                m for m in tar.getmembers()
                if m.isfile() and m.name.endswith(_KEEP) and ".." not in m.name.split("/")
            ]
            tar.extractall(dest, members=members, filter="data")
        done.write_text(archive.name)
    roots = [p.parent for p in dest.glob("*/PKG-INFO")]
    if len(roots) != 1:
        raise RuntimeError(f"{dest}: expected one project root with PKG-INFO, found {roots}")
    return roots[0]


def host_imports(name: str, version: str, requirements: tuple[str, ...]) -> pathlib.Path:
    """A folder holding ``requirements`` (pure-Python requirements of the host tree that the
    project's environment lacks), installed once with pip, without their dependencies, into
    the same cache; put it on ``sys.path`` after the tree to import the tree's modules."""
    dest = CACHE / "deps" / f"{name}-{version}"
    done = dest / ".complete"
    if not done.is_file():
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
             "--disable-pip-version-check", "--target", str(dest), *requirements],
            capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            text = proc.stderr[-1500:]
            if any(s in text for s in ("NewConnectionError", "Max retries", "No matching "
                                       "distribution", "Could not find a version")):
                raise IndexUnreachable(f"pip install {' '.join(requirements)}: {text}")
            raise RuntimeError(f"pip install {' '.join(requirements)} failed: {text}")
        done.write_text(" ".join(requirements))
    return dest


if __name__ == "__main__":
    for n, v in (("vllm-ascend", "0.23.0.post1"), ("vllm-hust", "0.17.2.post1")):
        print(host_tree(n, v))
