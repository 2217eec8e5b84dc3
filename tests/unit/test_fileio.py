"""fileio.write_atomic: the target holds the old or the new text, never a part."""

from __future__ import annotations

import os

import pytest

from vllm_hust_vspec import fileio

pytestmark = pytest.mark.unit


def test_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old\n")
    fileio.write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_failed_write_keeps_the_old_text(tmp_path, monkeypatch):
    target = tmp_path / "report.md"
    target.write_text("old\n")

    def full(fd):  # the disk fills while the new text is flushed
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        fileio.write_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
