"""An active vocabulary for the drafter: its LM head computes only N token ids.

:func:`install` replaces the drafter model's ``compute_logits`` (on the instance; the class,
and a target that shares the LM head, keep theirs) by one that multiplies the hidden states
with the N rows of the LM head's weight it copied once, applies the head's soft cap and
scale as vLLM's ``LogitsProcessor`` does, and writes the N logits into a full-vocabulary row
of ``-inf``.  Every consumer downstream (the greedy argmax, the drafter's probabilities for
sampled requests, the draft confidences) sees the vocabulary it expects and can only pick
an active id; the target still verifies every token, so output is unchanged (greedy: the
same tokens; sampled: the rejection sampler still samples the target's distribution).
What it saves is the LM head's (V - N) x H multiply per drafted row, what it costs is
acceptance wherever the target's token is not active.

Refused at start-up (the engine does not start): a head split over tensor-parallel ranks,
a drafter without ``lm_head`` / ``logits_processor``, ids outside its vocabulary.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.vocab_ids import load

logger = logging.getLogger("vllm_hust_vspec")

INSTALLED = "_vspec_active_vocab"  # attribute on the drafter model: the ids tensor


class ActiveVocabError(VspecError):
    """The active vocabulary cannot be installed on this drafter."""


def install(model: Any, path: str, size: int, option: str) -> int:
    """Give ``model`` (the drafter) an active vocabulary of the first ``size`` ids of
    ``path`` (all with 0); returns how many ids it computes."""
    import torch

    head = getattr(model, "lm_head", None)
    processor = getattr(model, "logits_processor", None)
    weight = getattr(head, "weight", None)
    if head is None or processor is None or not torch.is_tensor(weight):
        raise ActiveVocabError(f"{option}: the drafter {type(model).__name__} has no LM head "
                               "of its own to restrict (lm_head, logits_processor)")
    if getattr(model, "draft_id_to_target_id", None) is not None:
        raise ActiveVocabError(f"{option}: the drafter already computes its own draft "
                               "vocabulary (an EAGLE-3 head with draft_vocab_size); an active "
                               "vocabulary cannot be laid over it")
    if getattr(head, "tp_size", 1) != 1:
        raise ActiveVocabError(f"{option}: the drafter's LM head is split over "
                               f"{head.tp_size} tensor-parallel ranks; an active vocabulary "
                               "needs it whole (--draft-tensor-parallel-size 1)")
    vocab = int(getattr(processor, "org_vocab_size", weight.shape[0]))
    try:
        chosen = load(path, size, vocab_size=min(vocab, int(weight.shape[0])))
    except VspecError as exc:
        raise ActiveVocabError(f"{option}: {exc}") from None
    ids = torch.tensor(chosen, dtype=torch.long, device=weight.device)
    rows = weight.detach().index_select(0, ids).clone()
    bias = getattr(head, "bias", None)
    rows_bias = None if not torch.is_tensor(bias) else bias.detach().index_select(0, ids).clone()
    soft_cap, scale = processor.soft_cap, processor.scale
    original = model.compute_logits

    def compute_logits(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a signature this module does not know: the host's own
            return original(hidden_states, *args, **kwargs)
        logits = torch.nn.functional.linear(hidden_states.to(rows.dtype), rows, rows_bias)
        if soft_cap is not None:
            logits = torch.tanh(logits / soft_cap) * soft_cap
        if scale != 1.0:
            logits = logits * scale
        out = logits.new_full((logits.shape[0], vocab), float("-inf"))
        out.index_copy_(1, ids, logits)
        return out

    model.compute_logits = compute_logits
    setattr(model, INSTALLED, ids)
    logger.info("vllm-hust-vspec: the drafter's LM head computes %d of %d token ids (%s, %s)",
                len(chosen), vocab, option, path)
    return len(chosen)
