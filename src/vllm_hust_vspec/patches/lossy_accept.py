"""Patch ``RejectionSampler.forward``: the opt-in lossy acceptance rules, before the host's
verification.

What:   wraps ``vllm.v1.sample.rejection_sampler.RejectionSampler.forward``.  When the step's
        ``SpecDecodeMetadata`` carries lossy rules (``lossy-accept-context``: only when the
        settings set ``eagle_relaxed_accept_topk`` > 1 for EAGLE / EAGLE-3 or
        ``confidence_accept_margin``), :func:`vllm_hust_vspec.runtime.lossy_accept.relax`
        raises, in the step's target logits, the greedy draft tokens a rule accepts; then the
        host verifies as it does.  Otherwise (the default: strict) it only calls the host.
Why:    vSpec 0.14's ``--eagle-relaxed-accept-*`` and ``--confidence-accept-*`` (its users'
        ``eagle-relaxed`` preset); vLLM verifies strictly only.
Remove: when vLLM offers a lossy acceptance rule of its own (then map the flags onto it).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patches.lossy_accept_context import ATTR
from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_SAMPLER = "vllm.v1.sample.rejection_sampler"
_META = "vllm.v1.spec_decode.metadata"

SPEC = PatchSpec(
    name="lossy-accept",
    target=Symbol(_SAMPLER, "RejectionSampler.forward",
                  params=("metadata", "draft_probs", "logits", "sampling_metadata")),
    requires=(
        Symbol(_META, "SpecDecodeMetadata.target_logits_indices"),
        Symbol(_META, "SpecDecodeMetadata.num_draft_tokens"),
        Symbol(_META, "SpecDecodeMetadata.draft_token_ids"),
    ),
    process=PROCESS_WORKER,
    why="vSpec's opt-in lossy acceptance (relaxed top-K, confidence margin) on greedy drafts",
    remove_when="vLLM offers a lossy acceptance rule of its own",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.lossy_accept import relax

    @functools.wraps(original)
    def forward(self: Any, metadata: Any, draft_probs: Any, logits: Any,
                sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        lossy = getattr(metadata, ATTR, None)
        if lossy is not None and logits is not None:
            rules, lengths = lossy
            relax(logits, metadata, sampling_metadata, lengths, rules)
        return original(self, metadata, draft_probs, logits, sampling_metadata, *args, **kwargs)

    return forward
