"""Patch ``EagleProposer.propose``: EAGLE, EAGLE-3 and MTP resume exactly after K = 0 steps.

What:   sets ``vllm.v1.spec_decode.eagle.EagleProposer.propose`` (inherited from
        ``SpecDecodeBaseProposer``) to the wrapper of ``drafter-k0``, which hands the call
        to :func:`vllm_hust_vspec.runtime.drafter_sync.propose`: every drafting step keeps
        the target hidden states it hands the drafter (by KV slot,
        ``runtime/hidden_rows.py``), and before the first drafting step after K = 0 steps
        (which ``draft-propose`` ends before they reach the drafter, keeping their hidden
        states) one extra drafter pass runs over the positions each request missed, with
        their next tokens and kept hidden states, so the drafts are those of a drafter that
        never sat out.
Why:    vLLM 0.32/0.33 run the drafter's first pass at K = 0 "to keep the drafter KV cache
        in sync" (``llm_base_proposer.py``); and TensorRT-LLM, which skips it, drafts from
        rows never written once speculation resumes.
Remove: when vLLM skips the drafter at K = 0 and catches it up itself.
"""

from __future__ import annotations

from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol
from vllm_hust_vspec.patches.drafter_k0 import CATCH_UP_REQUIRES

_BASE = "vllm.v1.spec_decode.llm_base_proposer"
_RUNNER = "vllm.v1.worker.gpu_model_runner"

SPEC = PatchSpec(
    name="eagle-k0",
    target=Symbol("vllm.v1.spec_decode.eagle", "EagleProposer.propose",
                  params=("num_speculative_tokens", "target_token_ids", "target_positions",
                          "target_hidden_states", "common_attn_metadata",
                          "num_rejected_tokens_gpu")),
    requires=CATCH_UP_REQUIRES + (
        Symbol(_BASE, "SpecDecodeBaseProposer.hidden_states"),
        Symbol(_BASE, "SpecDecodeBaseProposer.needs_extra_input_slots"),
        Symbol(_BASE, "SpecDecodeBaseProposer.use_heterogeneous_vocab"),
        Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids",
               params=("hidden_states", "aux_hidden_states", "common_attn_metadata")),
        Symbol("vllm.v1.attention.backend", "CommonAttentionMetadata.slot_mapping"),
        Symbol(_RUNNER, "GPUModelRunner.use_aux_hidden_state_outputs"),
        Symbol("vllm.v1.worker.block_table", "MultiGroupBlockTable.block_tables"),
    ),
    process=PROCESS_WORKER,
    methods=("eagle", "eagle3", "mtp"),
    why="no drafter forward at K = 0; the missed positions are caught up from the kept "
        "target hidden states before the next draft",
    remove_when="vLLM skips the drafter at K = 0 and catches it up itself",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.patches import drafter_k0

    return drafter_k0.make(original)
