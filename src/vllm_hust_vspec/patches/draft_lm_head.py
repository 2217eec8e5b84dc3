"""Patch ``SpecDecodeBaseProposer.load_model``: the drafter's LM head, made cheaper when the
settings ask (an active vocabulary, a weight-only int8 head).

What:   wraps ``vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer.load_model``
        (draft_model, EAGLE, EAGLE-3 and MTP proposers inherit it).  After the host loaded
        the drafter, and only when the plugin settings set a head option for this method
        (``draft_active_vocab_ids`` / ``draft_lm_head_quantization`` for draft_model, the
        ``eagle_draft_*`` ones for EAGLE / EAGLE-3),
        :func:`vllm_hust_vspec.runtime.draft_lm_head.install` gives the drafter model a
        ``compute_logits`` over that head.  Otherwise the host runs untouched.  A head that
        cannot be installed fails the engine's start.
Why:    vSpec 0.14's ``--draft-active-vocab-*``, ``--eagle-draft-active-vocab-*`` and
        ``--*-lm-head-quantization``: the LM head is the drafter's largest matrix when its
        vocabulary is large (Qwen2.5-0.5B: 151,936 x 896 beside a 24-layer body), and vLLM
        has no option for it.
Remove: when vLLM restricts or quantizes a drafter's LM head itself.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_BASE = "vllm.v1.spec_decode.llm_base_proposer"
_LOGITS = "vllm.model_executor.layers.logits_processor"

SPEC = PatchSpec(
    name="draft-lm-head",
    target=Symbol(_BASE, "SpecDecodeBaseProposer.load_model", params=("target_model",)),
    requires=(
        Symbol(_BASE, "SpecDecodeBaseProposer.method"),
        Symbol(_LOGITS, "LogitsProcessor.soft_cap"),
        Symbol(_LOGITS, "LogitsProcessor.scale"),
        Symbol(_LOGITS, "LogitsProcessor.org_vocab_size"),
    ),
    process=PROCESS_WORKER,
    why="the drafter's LM head computes only the active vocabulary, or as int8 (vSpec's "
        "--draft-active-vocab-*, --*-lm-head-quantization)",
    remove_when="vLLM restricts or quantizes a drafter's LM head itself",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec import settings as settings_mod
    from vllm_hust_vspec.runtime.draft_lm_head import install

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        head = settings_mod.draft_head_for(settings_mod.from_env(),
                                           str(getattr(self, "method", "")), "plugin settings")
        if head is not None:
            ids, size, quantization, option = head
            install(self.model, option, ids, size, quantization)
        return result

    return load_model
