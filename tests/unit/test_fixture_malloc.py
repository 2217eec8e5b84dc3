"""scripts/fixtures/malloc.py: the build scripts re-execute under glibc tunables that keep freed
memory for reuse (same bits, a quarter less time a training step: docs/fixtures.md)."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from fixtures import malloc  # noqa: E402

ALL = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:"
       "glibc.malloc.top_pad=536870912")


def test_merged_appends_what_is_missing_and_keeps_what_the_user_set():
    assert malloc.merged("") == ALL
    assert malloc.merged(ALL) == ALL
    assert malloc.merged("glibc.malloc.mmap_max=7") == (
        "glibc.malloc.mmap_max=7:glibc.malloc.trim_threshold=4294967296:glibc.malloc.top_pad=536870912")
    assert malloc.merged("glibc.cpu.hwcaps=-AVX2") == "glibc.cpu.hwcaps=-AVX2:" + ALL


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the tunables are glibc's")
def test_a_script_reexecutes_itself_once_with_the_tunables_and_its_arguments(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from fixtures import malloc\n"
        "print('start', flush=True)\n"
        "malloc.reexec_with_tunables()\n"
        "print(json.dumps([sys.argv[1:], sys.flags.optimize, os.environ['GLIBC_TUNABLES']]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", malloc.DONE)}
    out = subprocess.run([sys.executable, "-O", str(script), "a b", "--x"], capture_output=True,
                         text=True, timeout=60, env=env, check=True).stdout.splitlines()
    assert out[:2] == ["start", "start"]  # ran twice: the second time under the tunables
    # same arguments, same interpreter flags, the tunables set
    assert json.loads(out[2]) == [["a b", "--x"], 1, ALL]
    assert len(out) == 3
