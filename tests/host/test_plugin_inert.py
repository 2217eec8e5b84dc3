"""Inert when disabled, fail closed when the host lacks a symbol (real vLLM, fresh process).

One subprocess (so no earlier test has patched anything):
1. with ``HUST_VSPEC_ENABLED`` unset, vLLM's own plugin loading calls our ``register()`` and
   not one attribute of any class we declare a patch for changes (identities compared);
2. a patch set containing one spec that names a missing host symbol raises ONE error naming
   it, and nothing is half-applied; a bad setting refuses likewise;
3. an engine with a speculative config and the plugin unset runs exactly as the host does:
   the scheduler keeps the host's own lookup (None) and the tokens equal target-only's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.host, pytest.mark.slow]

SCRIPT = r'''
import json, os, sys
fixtures = sys.argv[1]
from vllm_hust_vspec.patches import catalog, registry
from vllm_hust_vspec.patches.registry import Patch, PatchError
from vllm_hust_vspec.patchspec import PatchSpec, Symbol
from vllm_hust_vspec.settings import SettingsError

specs = [s for s in catalog.all_specs() if s.applies and s.family == 'vllm']
owners = {}
for s in specs:
    for sym in s.all_symbols:
        owner, attr, value = registry.resolve(sym)
        if isinstance(owner, type):
            owners[str(sym).rsplit(".", 1)[0]] = owner

def snapshot():
    snap = {}
    for name, owner in owners.items():
        for attr, value in vars(owner).items():
            snap[f"{name}.{attr}"] = id(value)
    for s in specs:
        snap["target:" + str(s.target)] = id(registry.resolve(s.target)[2])
    return snap

report = {}
before = snapshot()
report["attributes"] = len(before)
import vllm.plugins
vllm.plugins.load_general_plugins()          # vLLM's loader calls vllm_hust_vspec:register
import vllm_hust_vspec
vllm_hust_vspec.register()
report["inert"] = snapshot() == before

bad = PatchSpec("needs-missing", Symbol("vllm.v1.core.sched.scheduler", "Scheduler.no_such_hook"),
                (), "engine", "test", "test")
patches = list(catalog.patches_for(("frontend", "engine", "worker"), "vllm", False))
try:
    registry.apply(patches + [Patch(bad, lambda original: original)])
    report["fail_closed_error"] = None
except PatchError as exc:
    report["fail_closed_error"] = str(exc)
report["nothing_applied"] = snapshot() == before and registry.applied() == []

os.environ["HUST_VSPEC_ENABLED"] = "1"
os.environ["HUST_VSPEC_ADAPTIVE_POLICY"] = "bogus"
try:
    vllm_hust_vspec.register()
    report["bad_setting_error"] = None
except SettingsError as exc:
    report["bad_setting_error"] = str(exc)
report["nothing_applied_bad_setting"] = snapshot() == before
del os.environ["HUST_VSPEC_ENABLED"], os.environ["HUST_VSPEC_ADAPTIVE_POLICY"]

from vllm import LLM, SamplingParams
prompts = [l for l in open(os.path.join(fixtures, "prompts", "code.jsonl"))][:4]
prompts = [json.loads(l)["prompt"] for l in prompts]
sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
outs = {}
for name, spec in (("host", None), ("spec", {"method": "draft_model", "num_speculative_tokens": 4,
                                              "model": os.path.join(fixtures, "draft")})):
    llm = LLM(model=os.path.join(fixtures, "target"), dtype="float32", max_model_len=512,
              max_num_seqs=8, enforce_eager=True, seed=0, speculative_config=spec)
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    report[name + "_lookup_is_none"] = sched.dynamic_sd_lookup is None
    from vllm_hust_vspec.runtime.engine import runtime_of

    report[name + "_runtime"] = runtime_of(sched) is not None
    outs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.llm_engine.engine_core.shutdown()
    del llm
report["outputs_equal"] = outs["host"] == outs["spec"]
after = snapshot()
report["changed_by_host"] = sorted(k for k in before if after.get(k) != before[k])
print("REPORT " + json.dumps(report))
'''


def test_inert_when_disabled_and_fail_closed(fixtures_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUST_VSPEC_")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(fixtures_dir)], env=env,
                          capture_output=True, text=True, timeout=400)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    r = json.loads(lines[-1][len("REPORT "):])
    assert r["attributes"] > 50
    assert r["inert"] is True
    err = r["fail_closed_error"]
    assert err is not None
    assert "vllm.v1.core.sched.scheduler.Scheduler.no_such_hook (patch needs-missing)" in err
    assert err.count("(patch ") == 1  # only the missing symbol is reported
    assert r["nothing_applied"] is True
    assert "HUST_VSPEC_ADAPTIVE_POLICY" in r["bad_setting_error"]
    assert r["nothing_applied_bad_setting"] is True
    assert r["host_lookup_is_none"] and r["spec_lookup_is_none"]
    assert not r["host_runtime"] and not r["spec_runtime"]
    assert r["outputs_equal"] is True
    # running engines, vLLM itself may rebind some attributes; never one of our targets
    assert not [k for k in r["changed_by_host"] if k.startswith("target:")], r["changed_by_host"]
