"""The patch registry: checks first, all or nothing, idempotent, never overwrites twice.

Pure Python: the targets are small classes in a throwaway module (the registry is generic;
the real-host fail-closed test is in tests/host/test_plugin_inert.py)."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import types

import pytest

from vllm_hust_vspec.patches import catalog, registry
from vllm_hust_vspec.patches.registry import MARK, Patch, PatchError
from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PROCESSES, PatchSpec, Symbol

pytestmark = pytest.mark.unit

MOD = "vspec_fake_host"


@pytest.fixture
def host():
    mod = types.ModuleType(MOD)

    class Sched:
        def __init__(self) -> None:
            self.lookup = None

        def step(self, x: int) -> int:
            return x + 1

        def update(self, draft_token_ids: list) -> list:
            return draft_token_ids

    @dataclasses.dataclass
    class Output:
        num_spec: int = 0

    mod.Sched = Sched
    mod.Output = Output
    sys.modules[MOD] = mod
    # Patches that earlier (host) tests of this session applied to the real vLLM stay applied
    # and out of sight here: the registry starts empty for these tests and gets them back.
    outside = dict(registry._STATE)
    registry._STATE.clear()
    yield mod
    registry.revert_all()
    registry._STATE.update(outside)
    del sys.modules[MOD]


def _spec(name: str, target: str, *requires: Symbol, params: tuple[str, ...] = ()) -> PatchSpec:
    return PatchSpec(name=name, target=Symbol(MOD, target, params=params), requires=requires,
                     process=PROCESS_ENGINE, why="test", remove_when="never")


def _add_one(original):
    def step(self, x):
        return original(self, x) + 100

    return step


def test_apply_replaces_and_logs(host, caplog):
    caplog.set_level(logging.INFO, logger="vllm_hust_vspec")
    before = host.Sched.step
    names = registry.apply([Patch(_spec("p-step", "Sched.step"), _add_one)])
    assert names == ["p-step"]
    assert host.Sched().step(1) == 102
    assert host.Sched.step is not before
    assert getattr(host.Sched.step, MARK) == "p-step"
    assert f"patch p-step replaced {MOD}.Sched.step" in caplog.text
    assert registry.applied() == ["p-step"]


def test_apply_is_idempotent(host):
    patch = Patch(_spec("p-step", "Sched.step"), _add_one)
    registry.apply([patch])
    first = host.Sched.step
    registry.apply([patch])
    assert host.Sched.step is first
    assert host.Sched().step(1) == 102  # wrapped once, not twice


def test_missing_symbol_fails_closed_naming_it(host):
    good = Patch(_spec("p-step", "Sched.step"), _add_one)
    bad = Patch(_spec("p-bad", "Sched.update", Symbol(MOD, "Sched.no_such_method")), _add_one)
    before = (host.Sched.step, host.Sched.update)
    with pytest.raises(PatchError) as err:
        registry.apply([good, bad])
    msg = str(err.value)
    assert f"{MOD}.Sched.no_such_method (patch p-bad)" in msg
    assert "nothing was patched" in msg
    assert (host.Sched.step, host.Sched.update) == before
    assert registry.applied() == []


def test_missing_module_and_parameter_are_named(host):
    no_mod = Patch(PatchSpec("p-mod", Symbol("vspec_no_such_module", "X.y"), (), PROCESS_ENGINE,
                             "t", "t"), _add_one)
    no_param = Patch(_spec("p-param", "Sched.update", params=("draft_token_ids", "extra")),
                     _add_one)
    with pytest.raises(PatchError) as err:
        registry.apply([no_mod, no_param])
    msg = str(err.value)
    assert "vspec_no_such_module.X.y (patch p-mod): module vspec_no_such_module" in msg
    assert "signature lacks parameter(s) extra" in msg


def test_instance_attributes_resolve(host):
    # assigned in __init__ (read from the code object) and a dataclass field
    assert registry.resolve(Symbol(MOD, "Sched.lookup"))[1] == "lookup"
    assert registry.resolve(Symbol(MOD, "Output.num_spec"))[1] == "num_spec"
    with pytest.raises(registry.SymbolMissing, match="has no attribute 'nothing'"):
        registry.resolve(Symbol(MOD, "Sched.nothing"))


def test_never_overwrites_a_replaced_attribute(host):
    foreign = _add_one(host.Sched.step)
    setattr(foreign, MARK, "someone-else")
    host.Sched.step = foreign
    with pytest.raises(PatchError, match="already replaced by patch 'someone-else'"):
        registry.apply([Patch(_spec("p-step", "Sched.step"), _add_one)])
    assert host.Sched.step is foreign


def test_two_patches_same_target_refused(host):
    a = Patch(_spec("p-a", "Sched.step"), _add_one)
    b = Patch(_spec("p-b", "Sched.step"), _add_one)
    original = host.Sched.step
    with pytest.raises(PatchError, match="both replace"):
        registry.apply([a, b])
    assert host.Sched.step is original


def test_failing_make_applies_nothing(host):
    def broken(original):
        raise RuntimeError("boom")

    original = host.Sched.step
    with pytest.raises(PatchError, match="building the replacement .* boom"):
        registry.apply([Patch(_spec("p-step", "Sched.step"), _add_one),
                        Patch(_spec("p-upd", "Sched.update"), broken)])
    assert host.Sched.step is original


def test_replaced_behind_our_back_is_reported(host):
    patch = Patch(_spec("p-step", "Sched.step"), _add_one)
    registry.apply([patch])
    host.Sched.step = lambda self, x: x
    with pytest.raises(PatchError, match="replaced by someone else"):
        registry.apply([patch])


def test_revert_all_restores_identity(host):
    original = host.Sched.step
    registry.apply([Patch(_spec("p-step", "Sched.step"), _add_one)])
    registry.revert_all()
    assert host.Sched.step is original
    assert registry.applied() == []


def test_catalog_declares_every_patch_without_importing_vllm():
    code = (
        "import sys\n"
        "from vllm_hust_vspec.patches import catalog\n"
        "specs = catalog.all_specs()\n"
        "assert 'vllm' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vllm.'))\n"
        "print(len(specs))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(catalog.all_specs()) >= 7


def test_catalog_specs_are_complete():
    specs = catalog.all_specs()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    for s in specs:
        assert s.process in PROCESSES
        assert s.why and s.remove_when
        root = "vllm_ascend." if s.target.root == "vllm_ascend" else "vllm."
        assert s.target.module.startswith(root)
        # requirement-only specs: other families, and the vllm symbols of the Qwen2 EAGLE
        # registration (it adds to the host's registry, replaces nothing)
        assert s.applies or s.family != "vllm" or s.name == "qwen2-eagle-model"
    assert {"dynamic-sd-config", "scheduler-k", "spec-stats", "step-output", "draft-trim",
            "async-placeholders", "capture-sizes"} <= set(names)


def test_patch_set_per_process_and_platform():
    eng = {p.spec.name for p in catalog.patches_for(("engine", "worker"), "vllm", False)}
    assert "scheduler-k" in eng and "dynamic-sd-config" not in eng
    front = {p.spec.name for p in catalog.patches_for(("frontend",), "vllm", False)}
    assert front == {"dynamic-sd-config", "stats-decode", "stat-logger"}
    front_gpu = {p.spec.name for p in catalog.patches_for(("frontend",), "vllm", True)}
    assert front_gpu == {"dynamic-sd-config", "capture-sizes", "stats-decode", "stat-logger"}
    hust = [p.spec.name for p in catalog.patches_for(("frontend", "engine", "worker"),
                                                     "vllm-hust", True)]
    assert hust == ["hust-attach", "hust-step-k", "hust-spec-stats", "hust-step-output",
                    "hust-draft-trim", "hust-async-placeholders", "hust-draft-k"]
    assert [p.spec.name for p in catalog.patches_for(("frontend",), "vllm-hust", True)] == []
    assert [p.spec.name for p in catalog.patches_for(("worker",), "vllm-hust", False)] == [
        "hust-draft-k"]
    assert catalog.patches_for(("frontend", "engine", "worker"), "vllm-ascend", True) == ()


def test_instance_attributes_resolve_through_our_wrapper(host):
    def wrap_init(original):
        import functools

        @functools.wraps(original)
        def __init__(self):
            original(self)

        return __init__

    registry.apply([Patch(_spec("p-init", "Sched.__init__"), wrap_init)])
    # a second apply (register() runs again) still sees the attribute set in the host __init__
    registry.apply([Patch(_spec("p-init", "Sched.__init__", Symbol(MOD, "Sched.lookup")),
                          wrap_init)])
    assert registry.resolve(Symbol(MOD, "Sched.lookup"))[1] == "lookup"
