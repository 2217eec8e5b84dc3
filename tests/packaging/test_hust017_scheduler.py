"""The vLLM-HUST 0.17 patch set on that host's real scheduler (its sdist's Python tree, no model).

vLLM-HUST 0.17.2.post1 exists only as an sdist (fetched and cached by :mod:`sdists`, with
the two pure-Python requirements of its tree this environment lacks).  Its ``vllm`` package
collides with the installed vLLM 0.32, so ``hust017_driver.py`` runs in a subprocess with the
tree first on ``sys.path``: it applies the plugin's patch set for this host (``plugin.activate``,
the family detected from the tree's own distribution), drives the tree's ``Scheduler`` and
``AsyncScheduler`` the way the tree's tests/v1/core/test_scheduler.py does, and reports what
it saw.  Scheduler, requests, outputs, drafts and the n-gram proposer are the tree's own.

What cannot run here: the 0.17 model runners (its CPU runner refuses speculative decoding,
the GPU runner needs a GPU), so the worker wrap is checked by calling the patched
``GPUModelRunner.propose_draft_token_ids`` of the tree (its n-gram branch, with the tree's
real ``NgramProposer``) on a stand-in runner object; the tensor padding of the EAGLE / draft
model branch is in tests/unit/test_hust_drafter.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import sdists

pytestmark = pytest.mark.packaging

DRIVER = pathlib.Path(__file__).with_name("hust017_driver.py")
HUST = ("vllm-hust", "0.17.2.post1")
# pure-Python requirements of the 0.17 tree (its PKG-INFO) that vLLM 0.32's environment lacks
TREE_IMPORTS = ("gguf==0.19.0", "diskcache==5.6.3")
KMAX = 4


@pytest.fixture(scope="module")
def report(fixtures_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    try:
        tree = sdists.host_tree(*HUST)
        deps = sdists.host_imports(*HUST, TREE_IMPORTS)
    except sdists.IndexUnreachable as exc:
        pytest.skip(f"no package index can be reached, so the vllm-hust 0.17 tree is "
                    f"unavailable: {exc}")
    out = tmp_path_factory.mktemp("hust017")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HUST_VSPEC_", "HUST_SPECSLO_", "HUST_SPECASCEND_"))
           and k != "PYTHONPATH"}
    env.update(HUST_VSPEC_ENABLED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(tree), str(deps), str(fixtures_dir / "target"),
         str(fixtures_dir / "draft"), str(out)],
        capture_output=True, text=True, timeout=600, cwd=out, env=env, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    data = json.loads(lines[-1][len("REPORT "):])
    data["tree"] = str(tree)
    return data


def test_the_017_tree_is_the_host_and_gets_its_patch_set(report: dict) -> None:
    assert report["vllm_file"] == str(pathlib.Path(report["tree"]) / "vllm" / "__init__.py")
    assert report["host"] == list(HUST)
    assert report["patches"] == ["hust-attach", "hust-step-k", "hust-spec-stats",
                                 "hust-step-output", "hust-draft-trim",
                                 "hust-async-placeholders", "hust-draft-k"]


def test_per_step_k_reaches_the_scheduler_output_and_trims_the_drafts(report: dict) -> None:
    r = report["sync_per_step_k"]
    assert r["class"] == "Scheduler" and r["runtime"]
    # schedule policy 1-1:3,2-16:1 (Kmax 4): K 3 while one request decodes
    assert r["step1"]["k"] == 3
    # the runner hands over Kmax-wide drafts; the step's K keeps 3 of them
    assert r["after_drafts1"]["a"]["spec"] == [10, 11, 12]
    assert r["step2"] == {"k": 3, "scheduled": {"a": 4}, "spec": {"a": [10, 11, 12]}}
    # a prefill joining the step does not change K (decided on the decoding requests) ...
    assert r["step3"]["k"] == 3 and r["step3"]["scheduled"] == {"a": 4, "b": 8}
    # ... two decoding requests do: K 1, and the next drafts are cut to it
    assert r["step4"]["k"] == 1
    assert r["step4"]["spec"] == {"a": [30, 31, 32], "b": [40, 41, 42]}
    assert r["after_drafts4"] == {"a": {"computed": 16, "tokens": 17, "spec": [50]},
                                  "b": {"computed": 10, "tokens": 11, "spec": [60]}}


def test_num_computed_tokens_after_partial_acceptance(report: dict) -> None:
    r = report["sync_per_step_k"]
    # 8 prompt tokens + 1; then 3 drafts verified, 2 accepted: 3 tokens, 1 position rejected
    assert r["after_output2"]["a"] == {"computed": 11, "tokens": 12, "spec": []}
    # step 4: a rejects its first draft (1 token), b accepts 1 of 3 (2 tokens)
    assert r["after_output4"]["a"] == {"computed": 16, "tokens": 17, "spec": []}
    assert r["after_output4"]["b"] == {"computed": 10, "tokens": 11, "spec": []}


def test_the_controller_sees_each_steps_verification(report: dict) -> None:
    trace = report["sync_per_step_k"]["trace"]
    decisions = [(t["step"], t["batch"], t["k"]) for t in trace if "k" in t]
    assert decisions == [(1, 1, 3), (2, 1, 3), (3, 1, 3), (4, 2, 1)]
    results = [(t["step"], t["drafted"], t["accepted"]) for t in trace if "drafted" in t]
    assert results == [(1, 0, 0), (2, 3, 2), (3, 3, 3), (4, 6, 1)]


def test_per_request_k_i_trims_each_requests_drafts(report: dict) -> None:
    r = report["sync_per_request_k"]
    assert r["step1"]["k"] == 3
    assert r["after_drafts1"]["a"]["spec"] == [10]
    assert r["after_drafts1"]["b"]["spec"] == [20, 21, 22]
    assert r["step2"] == {"k": 3, "scheduled": {"a": 2, "b": 4},
                          "spec": {"a": [10], "b": [20, 21, 22]}}
    # a: 1 of 1 accepted (2 tokens); b: 1 of 3 (2 tokens, 2 positions rejected)
    assert r["after_output2"] == {"a": {"computed": 10, "tokens": 11, "spec": []},
                                  "b": {"computed": 10, "tokens": 11, "spec": []}}


def test_k0_keeps_no_draft(report: dict) -> None:
    r = report["sync_k0"]
    assert r["step1"]["k"] == 0
    assert r["after_drafts1"]["a"]["spec"] == []
    assert r["step2"] == {"k": 0, "scheduled": {"a": 1}, "spec": {}}


def test_async_placeholders_are_cut_to_k_and_k_i(report: dict) -> None:
    r = report["async_scheduler"]
    assert (r["class"], r["method"]) == ("AsyncScheduler", "draft_model")
    # the host sets Kmax (4) placeholders; the step's K (3) cuts them
    assert r["step1"]["k"] == 3
    assert r["after_schedule1"]["a"]["spec"] == [-1, -1, -1]
    assert r["step2"]["spec"] == {"a": [-1, -1, -1], "b": [-1, -1, -1]}
    # a: 1 of 3 accepted, b: 3 of 3; no step in flight: no placeholder left
    assert r["after_output2"]["a"]["computed"] == 10 and r["after_output2"]["a"]["tokens"] == 11
    assert r["after_output2"]["b"]["computed"] == 12 and r["after_output2"]["b"]["tokens"] == 13
    assert r["placeholders_left"] == [0, 0]
    # K 2 with a limited to 1
    assert r["step3"]["k"] == 2
    assert r["after_schedule3"]["a"]["spec"] == [-1]
    assert r["after_schedule3"]["b"]["spec"] == [-1, -1]
    results = [(t["step"], t["drafted"], t["accepted"]) for t in r["trace"] if "drafted" in t]
    assert results == [(1, 0, 0), (2, 6, 4)]


def test_the_scheduler_output_attribute_survives_pickling(report: dict) -> None:
    # the multiprocess executor sends SchedulerOutput to its workers pickled
    assert report["sync_per_step_k"]["pickled_k"] == 3


def test_the_worker_wrap_sets_the_drafters_k_for_the_call(report: dict) -> None:
    r = report["worker_ngram"]
    assert r["wrapped"] and r["k"] == 2
    # context 1 2 3 4 5 1 2 3: the n-gram [1 2 3] proposes 4 5 1 2 at Kmax
    assert r["drafts"] == [[4, 5]]  # K 2
    assert r["k_after"] == KMAX  # restored after the call
    assert r["drafts_k0"] == [[4]]  # K 0: the drafter still makes one (cut by the scheduler)
    assert r["drafts_no_k"] == [[4, 5, 1, 2]]  # no K from the engine core: untouched
