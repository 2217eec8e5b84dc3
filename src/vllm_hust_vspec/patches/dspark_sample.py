"""Patch ``DFlashProposer._sample_draft_tokens``: DSpark's Markov head and confidence head on V1.

What:   gives ``vllm.v1.spec_decode.dflash.DFlashProposer`` its own ``_sample_draft_tokens``
        (the class inherits ``SpecDecodeBaseProposer``'s, which ``draft-confidence-sample``
        wraps).  For a DSpark draft it drafts each block left to right, slot j's token the
        argmax of the backbone's logits plus the Markov bias of slot j-1's token, and, when
        ``draft-propose`` armed the drafter (the engine asked for draft signals), records the
        confidence head's calibrated per-slot confidences instead of draft probabilities
        (:func:`vllm_hust_vspec.runtime.dspark.sample_block`).  DFlash drafts go to the
        inherited method.
Why:    the V1 DFlash proposer samples every slot at once from the backbone alone; DSpark's
        Markov head makes slot j depend on slot j-1's token, and its confidence head is the
        signal the budget policy is built on.
Remove: when vLLM's V1 runner drafts DSpark.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_DFLASH = "vllm.v1.spec_decode.dflash"
# Applied only where the host has vLLM's Qwen3 DSpark model (a host without it cannot be
# asked for a DSpark draft: its own config refuses the architecture).
HOST_MODULE = "vllm.model_executor.models.qwen3_dspark"

SPEC = PatchSpec(
    name="dspark-sample",
    target=Symbol(_DFLASH, "DFlashProposer._sample_draft_tokens",
                  params=("hidden_states", "sampling_metadata")),
    requires=(
        Symbol(HOST_MODULE, "Qwen3DSparkForCausalLM.compute_draft_logits"),
        Symbol(HOST_MODULE, "Qwen3DSparkForCausalLM.markov_embed"),
        Symbol(HOST_MODULE, "Qwen3DSparkForCausalLM.markov_bias"),
        Symbol(HOST_MODULE, "Qwen3DSparkForCausalLM.map_draft_to_target"),
        Symbol(HOST_MODULE, "DSparkConfidenceHead.forward", params=("hidden", "markov_embed")),
    ),
    process=PROCESS_WORKER,
    methods=("dspark",),
    asked_only=True,
    adaptive=False,
    why="DSpark drafts on the V1 runner: sequential Markov sampling and the confidence head",
    remove_when="vLLM's V1 runner drafts DSpark",
)


def make(original: Any) -> Any:
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_hust_vspec.patches import draft_confidence_signals as signals
    from vllm_hust_vspec.runtime import dspark

    records_attr = signals.RECORDS

    @functools.wraps(original)
    def _sample_draft_tokens(self: Any, hidden_states: Any, sampling_metadata: Any) -> Any:
        if not dspark.is_dspark(self):
            # the inherited method as installed now (draft-confidence-sample wraps it)
            return super(DFlashProposer, self)._sample_draft_tokens(hidden_states, sampling_metadata)
        records = self.__dict__.get(records_attr)
        return dspark.sample_block(self, hidden_states, records, signals.from_logits), None

    return _sample_draft_tokens
