"""Lossy acceptance (opt-in): a greedy draft token the target did not rank first, accepted.

vSpec 0.14's two rules, for greedy requests only:

* relaxed top-K (``eagle_relaxed_accept_topk`` K > 1, EAGLE / EAGLE-3): the draft token is
  among the target's K best at its position, once the request has
  ``eagle_relaxed_accept_after_tokens`` output tokens;
* confidence margin (``confidence_accept_margin`` M): the target's logit of the draft token
  is within M of its best, from draft position ``confidence_accept_from_position`` on, once
  the request has ``confidence_accept_after_tokens`` output tokens, and neither the draft
  token nor the target's best is one of ``confidence_protected_token_ids``.

:func:`relax` applies them to the target's logits of a step before the host's rejection
sampler sees them: where a rule accepts a draft token that is not the target's best, that
token's logit is raised just above the best, so the host's own greedy verification accepts
it and everything after (the next positions, the bonus token, the bookkeeping) runs as
usual.  The rules read the raw logits (before penalties and logits processors; where those
then move the best elsewhere, the position stays strict).  A step in which a request asks
for logprobs is verified strictly (its logprobs would be those of the raised logits).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Rules:
    topk: int = 1
    topk_after: int = 0
    margin: float | None = None
    margin_from: int = 0
    margin_after: int = 0
    protected: tuple[int, ...] = ()

    @property
    def lossy(self) -> bool:
        return self.topk > 1 or self.margin is not None

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], method: str) -> Rules:
        topk = int(settings["eagle_relaxed_accept_topk"])
        if method not in ("eagle", "eagle3"):
            topk = 1  # the launcher refuses it for other methods; a plain server ignores it
        return cls(topk=topk, topk_after=int(settings["eagle_relaxed_accept_after_tokens"]),
                   margin=settings["confidence_accept_margin"],
                   margin_from=int(settings["confidence_accept_from_position"]),
                   margin_after=int(settings["confidence_accept_after_tokens"]),
                   protected=tuple(settings["confidence_protected_token_ids"] or ()))


def relax(logits: Any, metadata: Any, sampling: Any, output_lengths: Any, rules: Rules) -> int:
    """Raise, in ``logits`` (the step's, [tokens + requests, vocab], in place), the draft
    tokens the rules accept at the target positions of greedy requests; returns how many.

    ``output_lengths``: each request's output tokens before this step (numpy, in the batch's
    request order, as ``metadata.num_draft_tokens``)."""
    import torch

    if not rules.lossy or sampling.all_random or sampling.max_num_logprobs is not None:
        return 0
    draft = metadata.draft_token_ids
    if draft.numel() == 0:
        return 0
    device = logits.device
    counts = torch.tensor(metadata.num_draft_tokens, dtype=torch.long)
    req_of = torch.repeat_interleave(torch.arange(len(counts)), counts)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(draft.numel()) - starts[req_of]
    done = torch.as_tensor(output_lengths[:len(counts)], dtype=torch.long)[req_of] + position
    req_of, position, done = req_of.to(device), position.to(device), done.to(device)
    rows = metadata.target_logits_indices
    target = logits[rows].float()
    draft = draft.to(torch.long)
    mine = target.gather(1, draft[:, None])[:, 0]
    best, argmax = target.max(dim=1)
    ok = torch.zeros_like(mine, dtype=torch.bool)
    if rules.topk > 1:
        rank = (target > mine[:, None]).sum(dim=1)
        ok |= (rank < rules.topk) & (done >= rules.topk_after)
    if rules.margin is not None:
        fits = (best - mine <= rules.margin) & (position >= rules.margin_from)
        fits &= done >= rules.margin_after
        if rules.protected:
            protected = torch.tensor(rules.protected, dtype=torch.long, device=device)
            fits &= ~torch.isin(draft, protected) & ~torch.isin(argmax, protected)
        ok |= fits
    ok &= draft != argmax
    if not sampling.all_greedy:
        ok &= (sampling.temperature == 0)[req_of]
    n = int(ok.sum())
    if n:
        picked = rows[ok]
        logits[picked, draft[ok]] = (best[ok] + 1.0).to(logits.dtype)
    return n
