"""Patch ``Scheduler.make_spec_decoding_stats``: per-request drafted/accepted to the controller.

What:   wraps ``vllm.v1.core.sched.scheduler.Scheduler.make_spec_decoding_stats``; before
        the host's body runs, the request's drafted count (minus grammar-invalidated drafts,
        as the host's stats do) and accepted count go to the engine runtime.
Why:    the host calls it for every request with drafts in every step, even with
        ``--disable-log-stats`` (then it returns None), so it is the cheapest exact source
        of acceptance in the engine core.
Remove: when the scheduler exposes per-step, per-request acceptance to plugins.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_ENGINE, PatchSpec, Symbol

_SCHED = "vllm.v1.core.sched.scheduler"

SPEC = PatchSpec(
    name="spec-stats",
    target=Symbol(_SCHED, "Scheduler.make_spec_decoding_stats",
                  params=("spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens",
                          "num_invalid_spec_tokens", "request_id")),
    requires=(),
    process=PROCESS_ENGINE,
    why="feed each request's drafted/accepted counts to the controller every step",
    remove_when="the scheduler exposes per-request acceptance to plugins",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.engine import runtime_of

    @functools.wraps(original)
    def make_spec_decoding_stats(self: Any, spec_decoding_stats: Any, num_draft_tokens: int,
                                 num_accepted_tokens: int, num_invalid_spec_tokens: Any,
                                 request_id: str) -> Any:
        runtime = runtime_of(self)
        if runtime is not None:
            runtime.on_verified(request_id, num_draft_tokens, num_accepted_tokens,
                                num_invalid_spec_tokens)
        return original(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                        num_invalid_spec_tokens, request_id)

    return make_spec_decoding_stats
