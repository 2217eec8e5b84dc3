"""Run in a subprocess by test_hust017_scheduler.py: the plugin's vLLM-HUST 0.17 patch set on
that host's real Scheduler and AsyncScheduler (its own Python tree, first on sys.path), no
model and no engine.  Prints one JSON object: what each scenario observed.

argv: TREE DEPS TARGET DRAFT OUT_DIR.  TREE is the vLLM-HUST project root (holds ``vllm/``,
``tests/`` and its egg-info), DEPS the folder with the tree's pure-Python requirements this
environment lacks, TARGET / DRAFT the fixture model dirs (their configs only: nothing is
loaded), OUT_DIR where the decision traces go.  The env sets ``HUST_VSPEC_*``.

The tree is not built: its version string carries no ``+cpu``, so its platform detection
finds no platform; the driver selects the tree's own ``CpuPlatform``, as a CPU build would.
Requests, model outputs and drafts are made the way the tree's own
tests/v1/core/test_scheduler.py makes them (``create_requests``, ``ModelRunnerOutput`` with
``sampled_token_ids``, ``DraftTokenIds``); drafts arrive Kmax wide, as the 0.17 runner hands
them over (it copies every drafter result into a Kmax-wide buffer).
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import sys

TREE, DEPS, TARGET, DRAFT, OUT = sys.argv[1:6]
sys.path[:0] = [TREE, DEPS]

import vllm  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm.platforms.current_platform = CpuPlatform()

import torch  # noqa: E402
from tests.v1.core.utils import create_requests, create_scheduler  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from vllm_hust_vspec import plugin  # noqa: E402
from vllm_hust_vspec.host.detect import host_distribution  # noqa: E402
from vllm_hust_vspec.runtime.engine import runtime_of  # noqa: E402
from vllm_hust_vspec.runtime.hust_drafter import STEP_K_ATTR  # noqa: E402

KMAX = 4
PROMPT = 8


def env(trace: str, **settings: str) -> None:
    for k in [k for k in os.environ if k.startswith("HUST_VSPEC_") and k != "HUST_VSPEC_ENABLED"]:
        del os.environ[k]
    os.environ["HUST_VSPEC_ADAPTIVE_TRACE_FILE"] = str(pathlib.Path(OUT) / trace)
    for name, value in settings.items():
        os.environ["HUST_VSPEC_" + name.upper()] = value


def output(requests: list, sampled: list[list[int]]) -> ModelRunnerOutput:
    ids = [r.request_id for r in requests]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[])


def state(requests: list) -> dict:
    return {r.request_id: {"computed": r.num_computed_tokens, "tokens": r.num_tokens,
                           "spec": list(r.spec_token_ids)} for r in requests}


def step_view(so: SchedulerOutput) -> dict:
    return {"k": getattr(so, STEP_K_ATTR, None),
            "scheduled": dict(so.num_scheduled_tokens),
            "spec": {r: list(t) for r, t in so.scheduled_spec_decode_tokens.items()}}


def trace_results(name: str) -> list[dict]:
    lines = (pathlib.Path(OUT) / name).read_text().splitlines()
    return [json.loads(x) for x in lines[1:]]


class Limits:
    """A K forced from outside the controller (the runtime's ``KOverride`` interface, which
    the start-up calibration uses): this step's K and per-request limits K_i."""

    def __init__(self, k: int, limits: dict[str, int]) -> None:
        self.k, self.limits = k, limits

    def decide(self, running):  # noqa: ANN001, ANN201
        return self.k, dict(self.limits)

    def observe(self, t_output, scheduler_output):  # noqa: ANN001, ANN201
        pass


def sync_per_step_k() -> dict:
    """ngram, Kmax 4, the schedule policy: K 3 at batch 1, K 1 from batch 2 on."""
    env("sync.jsonl", adaptive_policy="schedule", adaptive_schedule="1-1:3,2-16:1")
    s = create_scheduler(model=TARGET, num_speculative_tokens=KMAX)
    (a,) = create_requests(1, num_tokens=PROMPT, ignore_eos=True, req_ids=["a"])
    s.add_request(a)
    out: dict = {"class": type(s).__name__, "runtime": runtime_of(s) is not None}
    so1 = s.schedule()  # the prompt
    out["step1"] = step_view(so1)
    s.update_from_output(so1, output([a], [[7]]))
    s.update_draft_token_ids(DraftTokenIds(["a"], [[10, 11, 12, 13]]))
    out["after_drafts1"] = state([a])
    so2 = s.schedule()  # verifies [10, 11, 12]
    out["step2"] = step_view(so2)
    out["pickled_k"] = getattr(pickle.loads(pickle.dumps(so2, pickle.HIGHEST_PROTOCOL)),
                               STEP_K_ATTR, None)
    s.update_from_output(so2, output([a], [[10, 11, 99]]))  # 2 of 3 accepted
    out["after_output2"] = state([a])
    (b,) = create_requests(1, num_tokens=PROMPT, ignore_eos=True, req_ids=["b"])
    s.add_request(b)
    s.update_draft_token_ids(DraftTokenIds(["a"], [[20, 21, 22, 23]]))
    so3 = s.schedule()  # a verifies [20, 21, 22] and b's prompt joins: the batch is 2
    out["step3"] = step_view(so3)
    s.update_from_output(so3, output([a, b], [[20, 21, 22, 23], [8]]))  # all 3 accepted
    s.update_draft_token_ids(DraftTokenIds(["a", "b"], [[30, 31, 32, 33], [40, 41, 42, 43]]))
    out["after_drafts3"] = state([a, b])
    so4 = s.schedule()
    out["step4"] = step_view(so4)
    s.update_from_output(so4, output([a, b], [[31], [40, 41]]))  # a rejects, b accepts
    out["after_output4"] = state([a, b])
    s.update_draft_token_ids(DraftTokenIds(["a", "b"], [[50, 51, 52, 53], [60, 61, 62, 63]]))
    out["after_drafts4"] = state([a, b])  # drafted at K 1
    out["trace"] = trace_results("sync.jsonl")
    return out


def sync_k0() -> dict:
    """The fixed policy at K 0: the drafter still makes one token (the worker's minimum),
    and no draft is kept or verified."""
    env("k0.jsonl", adaptive_policy="fixed", adaptive_fixed_gamma="0")
    s = create_scheduler(model=TARGET, num_speculative_tokens=KMAX)
    (a,) = create_requests(1, num_tokens=PROMPT, ignore_eos=True, req_ids=["a"])
    s.add_request(a)
    so1 = s.schedule()
    s.update_from_output(so1, output([a], [[7]]))
    s.update_draft_token_ids(DraftTokenIds(["a"], [[10, 0, 0, 0]]))
    out = {"step1": step_view(so1), "after_drafts1": state([a])}
    so2 = s.schedule()
    out["step2"] = step_view(so2)
    return out


def worker_ngram() -> dict:
    """The wrapped ``GPUModelRunner.propose_draft_token_ids`` of the 0.17 tree, its n-gram
    branch with the tree's real ``NgramProposer`` and a real ``SchedulerOutput``.  The runner
    itself is a stand-in (a namespace with the attributes that branch reads): 0.17's model
    runners cannot be built here (its CPU runner refuses speculative decoding, the GPU one
    needs a GPU)."""
    import types

    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    env("worker.jsonl", adaptive_policy="fixed", adaptive_fixed_gamma="2")
    s = create_scheduler(model=TARGET, num_speculative_tokens=KMAX)
    (a,) = create_requests(1, num_tokens=PROMPT, ignore_eos=True, req_ids=["a"])
    s.add_request(a)
    so = s.schedule()
    config = s.vllm_config
    config.speculative_config.prompt_lookup_min = 2
    config.speculative_config.prompt_lookup_max = 3
    tokens = np.zeros((1, 64), dtype=np.int32)
    tokens[0, :8] = [1, 2, 3, 4, 5, 1, 2, 3]
    runner = types.SimpleNamespace(
        speculative_config=config.speculative_config, num_spec_tokens=KMAX,
        drafter=NgramProposer(config),
        input_batch=types.SimpleNamespace(num_tokens_no_spec=np.array([8], dtype=np.int32),
                                          token_ids_cpu=tokens))

    def propose(scheduler_output: SchedulerOutput) -> list:
        return GPUModelRunner.propose_draft_token_ids(
            runner, scheduler_output, [[3]], None, None, None, None, None, None, None)

    out = {"wrapped": hasattr(GPUModelRunner.propose_draft_token_ids, "__wrapped__"),
           "k": getattr(so, STEP_K_ATTR), "drafts": propose(so), "k_after": runner.drafter.k}
    setattr(so, STEP_K_ATTR, 0)
    out["drafts_k0"] = propose(so)
    delattr(so, STEP_K_ATTR)
    out["drafts_no_k"] = propose(so)
    return out


def sync_per_request_k() -> dict:
    """Per-request limits K_i: a 1, b 3 (K 3) cut the Kmax-wide drafts."""
    env("ki.jsonl", adaptive_policy="fixed")
    s = create_scheduler(model=TARGET, num_speculative_tokens=KMAX)
    a, b = create_requests(2, num_tokens=PROMPT, ignore_eos=True, req_ids=["a", "b"])
    s.add_request(a)
    s.add_request(b)
    runtime = runtime_of(s)
    runtime.override_k(Limits(3, {"a": 1, "b": 3}))
    out: dict = {}
    so1 = s.schedule()
    out["step1"] = step_view(so1)
    s.update_from_output(so1, output([a, b], [[5], [6]]))
    s.update_draft_token_ids(DraftTokenIds(["a", "b"], [[10, 11, 12, 13], [20, 21, 22, 23]]))
    out["after_drafts1"] = state([a, b])
    so2 = s.schedule()
    out["step2"] = step_view(so2)
    s.update_from_output(so2, output([a, b], [[10, 77], [20, 88]]))  # a 1 of 1, b 1 of 3
    out["after_output2"] = state([a, b])
    return out


def async_scheduler() -> dict:
    """AsyncScheduler, the draft model (async scheduling refuses ngram on 0.17), Kmax 4:
    placeholders cut to the step's K (schedule policy, K 3 at batch 2) and to K_i."""
    env("async.jsonl", adaptive_policy="schedule", adaptive_schedule="1-2:3,3-16:1")
    model_config = ModelConfig(model=TARGET, dtype="float32", seed=42)
    scheduler_config = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8192,
                                       max_model_len=1024, async_scheduling=True,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=16, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=False)
    parallel_config = ParallelConfig()
    spec = SpeculativeConfig(model=DRAFT, method="draft_model", num_speculative_tokens=KMAX,
                             target_model_config=model_config,
                             target_parallel_config=parallel_config)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, parallel_config=parallel_config,
                             speculative_config=spec)
    kv = KVCacheConfig(num_blocks=1000, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1,
                                                       head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = 1000
    s = AsyncScheduler(vllm_config=vllm_config, kv_cache_config=kv, log_stats=True,
                       structured_output_manager=StructuredOutputManager(vllm_config),
                       block_size=16)
    a, b = create_requests(2, num_tokens=PROMPT, ignore_eos=True, req_ids=["a", "b"])
    s.add_request(a)
    s.add_request(b)
    out: dict = {"class": type(s).__name__, "method": str(spec.method)}
    so1 = s.schedule()
    out["step1"] = step_view(so1)
    out["after_schedule1"] = state([a, b])
    s.update_from_output(so1, output([a, b], [[7], [8]]))
    so2 = s.schedule()  # verifies 3 placeholders each
    out["step2"] = step_view(so2)
    s.update_from_output(so2, output([a, b], [[10, 99], [20, 21, 22, 23]]))  # 1 and 3 of 3
    out["after_output2"] = state([a, b])
    out["placeholders_left"] = [a.num_output_placeholders, b.num_output_placeholders]
    # per-request limits: K 2, a limited to 1
    runtime_of(s).override_k(Limits(2, {"a": 1}))
    so3 = s.schedule()
    out["step3"] = step_view(so3)
    out["after_schedule3"] = state([a, b])
    out["trace"] = trace_results("async.jsonl")
    return out


def main() -> None:
    report = {"vllm_file": vllm.__file__, "host": host_distribution(),
              "patches": plugin.activate()}
    for scenario in (sync_per_step_k, sync_per_request_k, sync_k0, async_scheduler,
                     worker_ngram):
        report[scenario.__name__] = scenario()
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
