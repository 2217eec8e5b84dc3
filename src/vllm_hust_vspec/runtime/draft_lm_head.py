"""The drafter's LM head, made cheaper: an active vocabulary, a weight-only int8 head, or both.

:func:`install` replaces the drafter model's ``compute_logits`` (on the instance; the class,
and a target that shares the LM head, keep theirs) by one over a head it built once from
the loaded weight:

* an active vocabulary (``vocab_ids.py``): only the N rows of the chosen ids; the N logits
  are written into a full-vocabulary row of ``-inf``, so every consumer downstream (the
  greedy argmax, the drafter's probabilities for sampled requests, the draft confidences)
  sees the vocabulary it expects and can only pick an active id;
* ``w8a16``: the rows as int8 with one scale per row (symmetric, round to nearest), through
  torch's weight-only int8 kernel (``aten._weight_int8pack_mm``) with bfloat16 activations;
  the logits come back in the model's dtype.

Then the head's soft cap and scale, as vLLM's ``LogitsProcessor`` applies them.  The target
still verifies every token, so output is unchanged (greedy: the same tokens; sampled: the
rejection sampler still samples the target's distribution); a cheaper head can only cost
acceptance, where its choice differs from the full head's.

Refused at start-up (the engine does not start): a head split over tensor-parallel ranks,
a drafter without ``lm_head`` / ``logits_processor``, an EAGLE-3 head with its own draft
vocabulary, ids outside the vocabulary, a torch without the int8 kernel.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.vocab_ids import load

logger = logging.getLogger("vllm_hust_vspec")

INSTALLED = "_vspec_lm_head"  # attribute on the drafter model: what was installed
QUANTIZATIONS = ("none", "w8a16")


class DraftHeadError(VspecError):
    """The drafter's LM head cannot be replaced as asked."""


def quantize_rows(weight: Any) -> tuple[Any, Any]:
    """(int8 rows, bfloat16 scale per row): symmetric, round to nearest."""
    import torch

    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.to(torch.bfloat16)


def install(model: Any, option: str, ids_path: str | None = None, size: int = 0,
            quantization: str = "none") -> dict[str, Any]:
    """Give ``model`` (the drafter) its cheaper head; returns what was installed."""
    import torch

    if quantization not in QUANTIZATIONS:
        raise DraftHeadError(f"{option}: quantization {quantization!r}: expected one of "
                             f"{', '.join(QUANTIZATIONS)}")
    head = getattr(model, "lm_head", None)
    processor = getattr(model, "logits_processor", None)
    weight = getattr(head, "weight", None)
    if head is None or processor is None or not torch.is_tensor(weight):
        raise DraftHeadError(f"{option}: the drafter {type(model).__name__} has no LM head "
                             "of its own to replace (lm_head, logits_processor)")
    if getattr(model, "draft_id_to_target_id", None) is not None:
        raise DraftHeadError(f"{option}: the drafter already computes its own draft "
                             "vocabulary (an EAGLE-3 head with draft_vocab_size)")
    if getattr(head, "tp_size", 1) != 1:
        raise DraftHeadError(f"{option}: the drafter's LM head is split over {head.tp_size} "
                             "tensor-parallel ranks; it must be whole "
                             "(--draft-tensor-parallel-size 1)")
    vocab = int(getattr(processor, "org_vocab_size", weight.shape[0]))
    ids = None
    rows = weight.detach()[:vocab]
    if ids_path is not None:
        try:
            chosen = load(ids_path, size, vocab_size=min(vocab, int(weight.shape[0])))
        except VspecError as exc:
            raise DraftHeadError(f"{option}: {exc}") from None
        ids = torch.tensor(chosen, dtype=torch.long, device=weight.device)
        rows = weight.detach().index_select(0, ids)
    bias = getattr(head, "bias", None)
    rows_bias = None
    if torch.is_tensor(bias):
        rows_bias = (bias.detach()[:vocab] if ids is None else bias.detach().index_select(0, ids))
        rows_bias = rows_bias.clone()
    if quantization == "w8a16":
        if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
            raise DraftHeadError(f"{option}: w8a16 needs torch's weight-only int8 kernel "
                                 "(aten._weight_int8pack_mm), which this torch lacks")
        q, scales = quantize_rows(rows)

        def matmul(h: Any) -> Any:
            out = torch.ops.aten._weight_int8pack_mm(h.to(torch.bfloat16), q, scales)
            out = out.to(h.dtype)
            return out if rows_bias is None else out + rows_bias
    else:
        dense = rows.clone()

        def matmul(h: Any) -> Any:
            return torch.nn.functional.linear(h.to(dense.dtype), dense, rows_bias)

    soft_cap, scale = processor.soft_cap, processor.scale
    original = model.compute_logits

    def compute_logits(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a signature this module does not know: the host's own
            return original(hidden_states, *args, **kwargs)
        logits = matmul(hidden_states)
        if soft_cap is not None:
            logits = torch.tanh(logits / soft_cap) * soft_cap
        if scale != 1.0:
            logits = logits * scale
        if ids is None:
            return logits
        out = logits.new_full((logits.shape[0], vocab), float("-inf"))
        out.index_copy_(1, ids, logits)
        return out

    model.compute_logits = compute_logits
    what = {"vocab": vocab, "ids": None if ids is None else int(ids.numel()),
            "quantization": quantization}
    setattr(model, INSTALLED, what)
    logger.info("vllm-hust-vspec: the drafter's LM head computes %s token ids%s (%s%s)",
                f"{what['ids']} of {vocab}" if ids is not None else f"all {vocab}",
                ", weight-only int8 (w8a16)" if quantization == "w8a16" else "", option,
                f", {ids_path}" if ids_path else "")
    return what
