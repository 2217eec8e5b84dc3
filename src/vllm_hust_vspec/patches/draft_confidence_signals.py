"""Draft confidence and top-k entropy per draft position (shared by the draft-confidence patches).

Not a patch: the arithmetic and the attribute names the ``draft-confidence-*`` patches use to
carry the signals from the drafter to the engine core.

* confidence of draft position j: the softmax probability, under the draft's own
  distribution, of the token drafted at j (float32).  Greedy drafts: the largest softmax
  probability; sampled drafts (``draft_sample_method="probabilistic"``): the probability of the
  sampled token under the temperature-scaled distribution the drafter sampled from.
* entropy of draft position j: the entropy (nats) of that distribution renormalised over its
  top ``TOPK_ENTROPY`` tokens.

How they travel: the engine sets ``SchedulerOutput.<FLAG>`` when its
controller needs confidences; the worker's drafter then records one (confidence, entropy) pair
of tensors per drafting pass; after the proposal the model runner stacks them into
``(num_reqs, K)`` float32 arrays; ``take_draft_token_ids`` attaches them to the
``DraftTokenIds`` it returns as ``<CONFIDENCES>`` / ``<ENTROPIES>`` (plain attributes on a
plain dataclass: they survive the pickling of multiprocess executors), and the engine core
reads them in ``Scheduler.update_draft_token_ids``.  Under asynchronous scheduling the drafts
stay on the worker: ``sample_tokens`` (``draft-confidence-output``) attaches the same arrays to
the step's ``ModelRunnerOutput`` and the engine core reads them in
``Scheduler.update_from_output``.

torch is imported inside the functions: the catalog imports the patch modules without it.
"""

from __future__ import annotations

from typing import Any

# tokens the entropy is renormalised over: the controller's contract (BatchView.entropies)
from vllm_hust_vspec.names import ENTROPY_TOPK as TOPK_ENTROPY

# SchedulerOutput attribute (engine -> worker): True when the engine wants the signals
FLAG = "vspec_draft_signals"
# DraftTokenIds attributes (worker -> engine): float32 numpy arrays (num_reqs, K)
CONFIDENCES = "vspec_confidences"
ENTROPIES = "vspec_entropies"
# drafter instance attribute: the list of per-pass (confidence, entropy) tensors while armed
RECORDS = "_vspec_signal_records"
# model runner instance attribute: (draft tensor, confidences, entropies) of the last proposal
RESULT = "_vspec_draft_signals"


def take_kept(runner: Any) -> tuple[Any, Any] | None:
    """The (confidences, entropies) ``draft-propose`` kept on ``runner`` for the drafts it
    holds now (the same draft tensor), or None; what was kept is consumed either way."""
    kept = runner.__dict__.pop(RESULT, None)
    if kept is None or kept[0] is not runner._draft_token_ids:
        return None
    return kept[1], kept[2]


def _entropy_top_k(scores: Any, log_space: bool) -> Any:
    """Entropy (nats) of each row renormalised over its top-k entries (``scores`` are logits
    when ``log_space`` else probabilities)."""
    import torch

    k = min(TOPK_ENTROPY, scores.shape[-1])
    top = scores.topk(k, dim=-1).values
    if log_space:
        p = torch.softmax(top, dim=-1)
    else:
        total = top.sum(dim=-1, keepdim=True)
        p = top / torch.where(total > 0, total, torch.ones_like(total))
    return -torch.special.xlogy(p, p).sum(dim=-1)


def from_logits(logits: Any) -> tuple[Any, Any]:
    """(confidence, entropy) per row of greedy-draft logits ``(rows, vocab)``: the softmax
    probability of the argmax token and the top-k entropy, both float32 ``(rows,)``."""
    import torch

    x = logits.float()
    conf = torch.exp(x.max(dim=-1).values - torch.logsumexp(x, dim=-1))
    return conf, _entropy_top_k(x, log_space=True)


def from_probs(probs: Any, token_ids: Any) -> tuple[Any, Any]:
    """(confidence, entropy) per row of sampled drafts: ``probs`` ``(rows, vocab)`` is the
    distribution the tokens ``token_ids`` ``(rows,)`` were drawn from."""
    p = probs.float()
    conf = p.gather(1, token_ids.reshape(-1, 1).long()).squeeze(1)
    return conf, _entropy_top_k(p, log_space=False)


def stack(records: list[tuple[Any, Any]], drafts: Any, where: str) -> tuple[Any, Any] | None:
    """The recorded passes as float32 numpy arrays shaped like ``drafts`` ``(num_reqs, K)``;
    None when nothing was recorded (K = 0, or a drafter that does not sample through
    ``SpecDecodeBaseProposer._sample_draft_tokens``).

    A pass records one row per request (sequential drafting) or ``K`` rows per request
    (parallel drafting, request-major).  Raises ``RuntimeError`` naming ``where`` when the
    recorded positions do not cover the drafts exactly (the host changed how it drafts)."""
    import torch

    rows, width = int(drafts.shape[0]), int(drafts.shape[1])
    if not records:
        return None
    try:
        conf = torch.cat([c.reshape(rows, -1) for c, _ in records], dim=1)
        ent = torch.cat([e.reshape(rows, -1) for _, e in records], dim=1)
    except RuntimeError as exc:
        raise RuntimeError(
            f"vllm-hust-vspec: {where}: draft confidences of {len(records)} drafting "
            f"pass(es) do not fit {rows} requests x {width} drafts ({exc})"
        ) from None
    if conf.shape[1] != width:
        raise RuntimeError(
            f"vllm-hust-vspec: {where}: {conf.shape[1]} draft confidences per request for "
            f"{width} drafts (the host's drafting loop changed; unset the confidence-driven "
            "policy/stop or update vllm-hust-vspec)"
        )
    return (conf.detach().to("cpu", torch.float32).numpy(),
            ent.detach().to("cpu", torch.float32).numpy())
