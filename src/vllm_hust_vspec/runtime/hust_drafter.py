"""The worker's side of the per-step K on vLLM-HUST 0.17 (patch ``hust-draft-k``).

That host's proposers take no K argument: each reads its own Kmax attribute while it drafts
(``SpecDecodeBaseProposer.num_speculative_tokens`` for EAGLE, EAGLE-3, MTP and the draft
model; ``NgramProposer.k`` for n-gram).  :func:`propose_with_k` sets that attribute to the
step's K (at least 1: the drafter's first pass also writes its KV for the new token, so it
always runs) for one ``propose_draft_token_ids`` call and restores it, then pads a tensor
result ``[B, K']`` back to ``[B, Kmax]``: the runner copies drafts into a Kmax-wide buffer and
reads them with stride Kmax.  The padding is never verified: the engine core cuts every
request's drafts (sync) or placeholders (async) to the step's K.  A list result (n-gram on
the CPU) is ragged already and passes as it is.

The step's K travels from the engine core in the ``SchedulerOutput`` attribute
:data:`STEP_K_ATTR` (set by ``hust-step-k``); an output without it (the plugin is off in the
engine core) leaves the drafter alone.  torch is imported only to pad a tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# the SchedulerOutput attribute that carries the step's K to every worker (a dataclass
# instance pickles its __dict__, so the attribute reaches workers in other processes)
STEP_K_ATTR = "vspec_num_spec_tokens"

# where each method's proposer keeps the number of tokens it drafts
_K_ATTRIBUTE = {"eagle": "num_speculative_tokens", "eagle3": "num_speculative_tokens",
                "mtp": "num_speculative_tokens", "draft_model": "num_speculative_tokens",
                "ngram": "k"}


def k_attribute(method: str, drafter: Any) -> str | None:
    """The drafter attribute that sets how many tokens it drafts, or None when this drafter
    must draft Kmax (a method whose proposer asserts it, parallel drafting, whose slots per
    request are fixed at start-up, or a draft tree other than a chain)."""
    name = _K_ATTRIBUTE.get(method)
    if name is None or not hasattr(drafter, name):
        return None
    if getattr(drafter, "parallel_drafting", False):
        return None
    tree = getattr(drafter, "tree_choices", None)
    if tree and any(any(i != 0 for i in node) for node in tree):
        return None
    return name


def propose_with_k(runner: Any, scheduler_output: Any, call: Callable[[], Any]) -> Any:
    """``call()`` (the host's ``propose_draft_token_ids``) with the runner's drafter set to
    draft the step's K, its result padded back to Kmax columns."""
    kmax = int(getattr(runner, "num_spec_tokens", 0) or 0)
    k = getattr(scheduler_output, STEP_K_ATTR, None)
    if k is None or not kmax or int(k) >= kmax:
        return call()
    drafter = runner.drafter
    name = k_attribute(str(runner.speculative_config.method), drafter)
    if name is None:
        return call()
    saved = getattr(drafter, name)
    setattr(drafter, name, max(int(k), 1))
    try:
        drafts = call()
    finally:
        setattr(drafter, name, saved)
    return pad_to(drafts, kmax)


def pad_to(drafts: Any, kmax: int) -> Any:
    """A ``[B, K']`` draft tensor padded with token 0 (the id the host itself fills the
    buffer with when the drafter cannot run) to ``[B, kmax]``; anything else as given."""
    if isinstance(drafts, list) or getattr(drafts, "ndim", 0) != 2 or drafts.shape[1] >= kmax:
        return drafts
    import torch

    return torch.nn.functional.pad(drafts, (0, kmax - int(drafts.shape[1])), value=0)
