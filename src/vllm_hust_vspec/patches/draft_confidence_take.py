"""Patch ``GPUModelRunner.take_draft_token_ids``: send the draft confidences with the drafts.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.take_draft_token_ids``; when
        ``draft-propose`` kept signals for the drafts now taken (same draft
        tensor), the returned ``DraftTokenIds`` gets two extra attributes, float32 numpy
        arrays of shape (len(req_ids), K) aligned with its rows: ``vspec_confidences`` and
        ``vspec_entropies`` (top-8 entropy, nats).  The signals are consumed either way.
Why:    under synchronous scheduling ``DraftTokenIds`` is the object that carries the drafts to
        the engine core (``EngineCore.post_step`` -> ``Scheduler.update_draft_token_ids``),
        where the per-request K_i of the next verification is chosen; a plain dataclass, its
        extra attributes survive the multiprocess executor's pickling.
Remove: with ``draft-confidence-sample``.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"

SPEC = PatchSpec(
    name="draft-confidence-take",
    target=Symbol(_RUNNER, "GPUModelRunner.take_draft_token_ids"),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner._draft_token_ids"),
        Symbol("vllm.v1.outputs", "DraftTokenIds.req_ids"),
        Symbol("vllm.v1.outputs", "DraftTokenIds.draft_token_ids"),
    ),
    process=PROCESS_WORKER,
    why="carry draft confidences to the engine core with the drafts they describe",
    remove_when="the V1 proposers return draft confidences for greedy drafts",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.patches import draft_confidence_signals as signals

    conf_attr, ent_attr = signals.CONFIDENCES, signals.ENTROPIES

    @functools.wraps(original)
    def take_draft_token_ids(self: Any) -> Any:
        out = original(self)
        kept = signals.take_kept(self)
        if out is None or kept is None:
            return out
        conf, ent = kept
        rows = len(out.req_ids)
        width = len(out.draft_token_ids[0]) if out.draft_token_ids else 0
        if conf.shape != (rows, width):
            raise RuntimeError(
                f"vllm-hust-vspec: draft-confidence-take: confidences of shape {conf.shape} "
                f"for {rows} requests x {width} drafts"
            )
        setattr(out, conf_attr, conf)
        setattr(out, ent_attr, ent)
        return out

    return take_draft_token_ids
