"""Patch ``DFlashProposer.set_inputs_first_pass``: DSpark's anchor-as-first block on V1.

What:   wraps ``vllm.v1.spec_decode.dflash.DFlashProposer.set_inputs_first_pass``.  When the
        proposer's model is a DSpark draft (a Markov head: the V1 runner got it from
        :func:`vllm_hust_vspec.runtime.dspark.run_on_v1`) and the step drafts K >= 1, the host
        lays out the anchor and K - 1 mask tokens (its own kernel, asked for K - 1 masks), every
        one of the K query slots is sampled, and the anchors are kept for the Markov head
        (:func:`~vllm_hust_vspec.runtime.dspark.block_inputs`).  DFlash drafts, and K = 0 steps
        where the drafter runs (``--adaptive-k0-drafter run``: once, to store the context;
        ``dflash-k0`` skips them otherwise), run the host untouched.
Why:    vLLM 0.32 drafts DSpark only in its V2 GPU runner; the V1 DFlash proposer lays out
        DFlash's 1 + K fill-in block (the mask at p+j predicts p+j), while a DSpark draft
        trained in DeepSpec's layout predicts p+j+1 from slot j.
Remove: when vLLM's V1 runner drafts DSpark (or the CPU host runs the V2 runner).
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
    name="dspark-inputs",
    target=Symbol(_DFLASH, "DFlashProposer.set_inputs_first_pass",
                  params=("target_token_ids", "next_token_ids", "target_positions",
                          "target_hidden_states", "token_indices_to_sample", "cad",
                          "num_rejected_tokens_gpu")),
    requires=(
        Symbol(_DFLASH, "DFlashProposer.num_speculative_tokens"),
        Symbol(_DFLASH, "DFlashProposer.arange"),
        Symbol(HOST_MODULE, "Qwen3DSparkForCausalLM.markov_bias"),
    ),
    process=PROCESS_WORKER,
    methods=("dspark",),
    asked_only=True,
    adaptive=False,
    why="DSpark drafts on the V1 runner: the anchor-as-first block through the host's DFlash layout",
    remove_when="vLLM's V1 runner drafts DSpark",
)


def make(original: Any) -> Any:
    import inspect

    from vllm_hust_vspec.runtime import dspark

    signature = inspect.signature(original)

    @functools.wraps(original)
    def set_inputs_first_pass(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.num_speculative_tokens < 1 or not dspark.is_dspark(self):
            return original(self, *args, **kwargs)
        next_token_ids = signature.bind(self, *args, **kwargs).arguments["next_token_ids"]
        return dspark.block_inputs(original, self, next_token_ids, args, kwargs)

    return set_inputs_first_pass
