"""Patch ``GPUModelRunner.propose_draft_token_ids`` on vLLM-HUST 0.17: the drafter drafts K.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids``;
        for one call the runner's drafter drafts the step's K (at least 1) from
        ``SchedulerOutput.vspec_num_spec_tokens`` (``hust-step-k``), and a ``[B, K']``
        tensor result is padded back to ``[B, Kmax]`` (``runtime/hust_drafter.py``).
Why:    0.17's proposers take no K argument: each drafts its own
        ``num_speculative_tokens`` (``k`` for n-gram), and the runner copies the drafts into
        a Kmax-wide buffer that it indexes with stride Kmax.  Without this the drafter
        always pays Kmax passes and only verification shrinks.
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (its drafters honour
        ``num_spec_tokens_to_schedule``).
Note:   0.17's CPU model runner refuses speculative decoding, so this runs on CUDA/NPU hosts
        only; its K-setting and padding are unit-tested on a stand-in runner.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import FAMILY_HUST, PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"
_EAGLE = "vllm.v1.spec_decode.eagle"

SPEC = PatchSpec(
    name="hust-draft-k",
    target=Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids",
                  params=("scheduler_output",)),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner.drafter"),
        Symbol(_RUNNER, "GPUModelRunner.num_spec_tokens"),
        Symbol(_RUNNER, "GPUModelRunner.speculative_config"),
        Symbol(_RUNNER, "GPUModelRunner.draft_token_ids_cpu"),
        Symbol(_EAGLE, "SpecDecodeBaseProposer.num_speculative_tokens"),
        Symbol(_EAGLE, "SpecDecodeBaseProposer.parallel_drafting"),
        Symbol("vllm.v1.spec_decode.ngram_proposer", "NgramProposer.k"),
    ),
    process=PROCESS_WORKER,
    family=FAMILY_HUST,
    methods=("draft_model", "eagle", "eagle3", "mtp", "ngram"),
    why="the 0.17 drafter drafts only the step's K tokens",
    remove_when="vLLM-HUST rebases onto vLLM >= 0.24 (drafters take the step's K)",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.hust_drafter import propose_with_k

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, *args: Any,
                                **kwargs: Any) -> Any:
        return propose_with_k(self, scheduler_output,
                              lambda: original(self, scheduler_output, *args, **kwargs))

    return propose_draft_token_ids
