"""The pairing check (host/pairing.py) on small source trees written here: which imports of a
plugin package resolve in a host tree, which do not, and what the cache keeps."""

from __future__ import annotations

import json
import pathlib

from vllm_hust_vspec.host import pairing


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _trees(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    host, pkg = tmp_path / "h" / "vllm", tmp_path / "p" / "vllm_ascend"
    _write(host, {
        "__init__.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
        "config.py": "from collections import OrderedDict\nclass VllmConfig:\n    pass\n",
        "core/__init__.py": "from .sched import *\n",
        "core/sched.py": "class Scheduler:\n    pass\n",
        "utils.py": "X = 1\n",
    })
    _write(pkg, {
        "__init__.py": "def register():\n    return 'vllm_ascend.platform.NPUPlatform'\n",
        "platform.py": ("from vllm.config import VllmConfig, OrderedDict\n"
                        "from vllm.core import Scheduler\n"
                        "from vllm import LLM\n"
                        "from vllm import utils\n"
                        "import vllm.core.sched\n"
                        "from .worker import W\n"
                        "class NPUPlatform:\n    worker = 'vllm_ascend.worker.W'\n"),
        "worker.py": ("from vllm.config import Missing\n"
                      "try:\n    from vllm.gone import A\nexcept ImportError:\n    A = None\n"
                      "if False:\n    from vllm.other import B\n"
                      "def late():\n    from vllm.nowhere import C\n"
                      "class W:\n    pass\n"),
        "unused.py": "from vllm.absent import Z\n",  # nothing leads here
        "runner.py": "import vllm.no_such_module\n",
    })
    return pkg, host


def test_closure_resolves_what_the_host_has_and_names_what_it_lacks(tmp_path):
    pkg, host = _trees(tmp_path)
    result = pairing.PairingCheck(pkg, host).run()
    assert not result.ok
    got = [(u.module, u.line, u.source, u.name) for u in result.unresolved]
    # only the unconditional module-level import of a module the closure reaches
    assert got == [("vllm_ascend.worker", 1, "vllm.config", "Missing")]
    assert result.modules == 3  # __init__ -> platform (a string) -> worker (an import)
    assert result.imports == 7
    assert "Missing not defined in vllm.config" in result.unresolved[0].detail


def test_a_module_the_host_lacks_is_named(tmp_path):
    pkg, host = _trees(tmp_path)
    (pkg / "__init__.py").write_text("from . import runner\n")
    result = pairing.PairingCheck(pkg, host).run()
    assert [(u.source, u.name, u.detail) for u in result.unresolved] == [
        ("vllm.no_such_module", None, "no module vllm.no_such_module in the host tree")]


def test_cache_is_reused_until_a_file_changes(tmp_path):
    pkg, host = _trees(tmp_path)
    cache = tmp_path / "cache"
    first = pairing.check(pkg, host, cache)
    assert first["ok"] is False and first["unresolved_count"] == 1
    (entry,) = cache.glob("*.json")
    entry.write_text(json.dumps({**first, "marker": 1}))
    assert pairing.check(pkg, host, cache)["marker"] == 1  # same trees: the kept answer
    (host / "config.py").write_text("class VllmConfig:\n    pass\nclass Missing:\n    pass\n"
                                    "from collections import OrderedDict\n")
    again = pairing.check(pkg, host, cache)
    assert again["ok"] is True and "marker" not in again
