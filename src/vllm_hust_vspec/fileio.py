"""Output files written whole or not at all (a leaf: no project imports).

:func:`write_atomic` writes a temporary file beside the target, flushes it to disk and
renames it over the target, so a reader (or a process stopped mid-write) never sees half a
file: the target holds either its old content or the new one.
"""

from __future__ import annotations

import contextlib
import os
import pathlib


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) atomically."""
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
