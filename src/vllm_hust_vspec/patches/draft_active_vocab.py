"""Patch ``SpecDecodeBaseProposer.load_model``: the drafter's LM head computes only the
active vocabulary when one is configured.

What:   wraps ``vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer.load_model``
        (draft_model, EAGLE, EAGLE-3 and MTP proposers inherit it).  After the host loaded
        the drafter, and only when the plugin settings name an active vocabulary for this
        method (``draft_active_vocab_ids`` for draft_model, ``eagle_draft_active_vocab_ids``
        for EAGLE / EAGLE-3), :func:`vllm_hust_vspec.runtime.active_vocab.install` gives the
        drafter model a ``compute_logits`` over those ids.  Otherwise the host runs
        untouched.  An active vocabulary that cannot be installed fails the engine's start.
Why:    vSpec 0.14's ``--draft-active-vocab-*`` / ``--eagle-draft-active-vocab-*``: the LM
        head is the drafter's largest matrix when its vocabulary is large (Qwen2.5-0.5B:
        151,936 x 896 against a 24-layer body), and vLLM has no option for it.
Remove: when vLLM restricts a drafter's LM head itself.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_BASE = "vllm.v1.spec_decode.llm_base_proposer"

SPEC = PatchSpec(
    name="draft-active-vocab",
    target=Symbol(_BASE, "SpecDecodeBaseProposer.load_model", params=("target_model",)),
    requires=(
        Symbol(_BASE, "SpecDecodeBaseProposer.method"),
        Symbol("vllm.model_executor.layers.logits_processor", "LogitsProcessor.soft_cap"),
        Symbol("vllm.model_executor.layers.logits_processor", "LogitsProcessor.scale"),
        Symbol("vllm.model_executor.layers.logits_processor", "LogitsProcessor.org_vocab_size"),
    ),
    process=PROCESS_WORKER,
    why="the drafter's LM head computes only the active vocabulary (vSpec's "
        "--draft-active-vocab-*)",
    remove_when="vLLM restricts a drafter's LM head itself",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec import settings as settings_mod
    from vllm_hust_vspec.runtime.active_vocab import install

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        settings = settings_mod.from_env()
        method = str(getattr(self, "method", ""))
        chosen = settings_mod.active_vocab_for(settings, method, "plugin settings")
        if chosen is not None:
            path, size = chosen
            option = settings_mod.ACTIVE_VOCAB[method][0]
            install(self.model, path, size, settings_mod.option(option).cli_flag)
        return result

    return load_model
