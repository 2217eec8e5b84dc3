"""Where the tiny model fixtures live (the layout `./manage.sh fixtures` builds).

``$VSPEC_FIXTURES`` (set by ``./manage.sh test``) names a build directly; otherwise the
``current`` link under ``${VSPEC_FIXTURES_DIR:-~/.cache/vllm-hust-vspec/fixtures}``.
"""

from __future__ import annotations

import os
import pathlib


def fixtures_dir(explicit: str | os.PathLike[str] | None = None) -> pathlib.Path:
    if explicit:
        return pathlib.Path(explicit)
    if os.environ.get("VSPEC_FIXTURES"):
        return pathlib.Path(os.environ["VSPEC_FIXTURES"])
    base = os.environ.get("VSPEC_FIXTURES_DIR") or os.path.expanduser(
        "~/.cache/vllm-hust-vspec/fixtures")
    return pathlib.Path(base) / "current"
