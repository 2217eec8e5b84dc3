"""Fetch real host source trees (sdists) from PyPI for the doctor's tests.

``vllm-ascend==0.23.0.post1`` and ``vllm-hust==0.17.2.post1`` exist on PyPI only as sdists,
and ``pip download`` fails on them while building metadata.  So we read the index's simple
page (PEP 503 links carrying ``#sha256=``) with urllib (the machine's pip config points at
local file indexes, which do not have them), download the ``.tar.gz`` itself, verify its
sha256 against the index, and cache it under ``~/.cache/vllm-hust-vspec/sdists/``.
Extraction keeps only ``*.py``, ``*.toml``, ``*.cfg`` and ``PKG-INFO`` members (what the
doctor reads), into the same cache.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import pathlib
import tarfile
import urllib.error
import urllib.parse
import urllib.request

INDEX = "https://pypi.org/simple/{name}/"
CACHE = pathlib.Path(
    os.environ.get("VSPEC_SDIST_CACHE", os.path.expanduser("~/.cache/vllm-hust-vspec/sdists"))
)


class IndexUnreachable(RuntimeError):
    """PyPI could not be reached (the only reason a test may skip)."""


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


def _sdist_entry(name: str, version: str) -> dict:
    """``{"filename", "url", "digests": {"sha256"}}`` of the sdist, from the simple page."""
    url = INDEX.format(name=name)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            page = resp.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise IndexUnreachable(f"{url}: server error {exc.code}") from exc
        raise RuntimeError(f"{url}: HTTP {exc.code} (the index answered: not a skip)") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise IndexUnreachable(f"cannot reach {url}: {exc}") from exc
    links = _Links()
    links.feed(page)
    want = f"{name.replace('-', '_')}-{version}.tar.gz"
    for href in links.hrefs:
        target, _, fragment = href.partition("#")
        filename = urllib.parse.unquote(target.rsplit("/", 1)[-1])
        if filename.lower() == want.lower() and fragment.startswith("sha256="):
            return {"filename": filename, "url": urllib.parse.urljoin(url, target),
                    "digests": {"sha256": fragment[len("sha256="):]}}
    raise RuntimeError(f"{url}: no {want} with a sha256 fragment on the index page")


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


if __name__ == "__main__":
    for n, v in (("vllm-ascend", "0.23.0.post1"), ("vllm-hust", "0.17.2.post1")):
        print(host_tree(n, v))
