"""The vllm family's patches that apply unchanged on vLLM-HUST 0.17, declared for that family.

What:   the same wrappers as on vLLM >= 0.24, declared for the 0.17 family under their own
        names (``hust-`` + the name) so the doctor checks them on that tree:
        ``spec-stats`` (each request's drafted and accepted counts from
        ``Scheduler.make_spec_decoding_stats``), ``step-output`` (the step's wall time and
        results around ``Scheduler.update_from_output``), ``draft-trim`` (sync drafts cut
        in ``Scheduler.update_draft_token_ids``) and ``async-placeholders`` (async
        placeholders cut after ``AsyncScheduler._update_after_schedule``).
Why:    these host methods have the same names and parameters on 0.17 (checked statically by
        the doctor and run on the 0.17 scheduler in tests/packaging/test_hust017_scheduler.py).
        What differs is the width: 0.17 hands the drafts and placeholders over Kmax wide
        whatever K the drafter made, so the runtime (attached by ``hust-attach`` without a
        K lookup) cuts them to the step's K as well as to each K_i
        (``EngineRuntime.pads_to_kmax``).
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (then the originals apply).
"""

from __future__ import annotations

import dataclasses

from vllm_hust_vspec.patches import async_placeholders, draft_trim, spec_stats, step_output
from vllm_hust_vspec.patchspec import FAMILY_HUST, PatchSpec, Symbol

_REMOVE = "vLLM-HUST rebases onto vLLM >= 0.24 (then {} applies)"


def _for_hust(spec: PatchSpec, why: str | None = None, **changes: object) -> PatchSpec:
    return dataclasses.replace(spec, name="hust-" + spec.name, family=FAMILY_HUST,
                               remove_when=_REMOVE.format(spec.name),
                               why=why or spec.why, **changes)


_ASYNC = "vllm.v1.core.sched.async_scheduler"

# (spec, make) pairs: the catalog lists them beside the one-patch modules
PATCHES = (
    (_for_hust(spec_stats.SPEC), spec_stats.make),
    (_for_hust(step_output.SPEC), step_output.make),
    (_for_hust(draft_trim.SPEC,
               "the step's K and per-request K_i under synchronous scheduling on 0.17"),
     draft_trim.make),
    (_for_hust(async_placeholders.SPEC,
               "the step's K and per-request K_i under asynchronous scheduling on 0.17",
               # 0.17 sets the placeholders itself (Kmax of them): the helper it calls
               requires=(Symbol(_ASYNC, "AsyncScheduler._spec_token_placeholders"),
                         Symbol("vllm.v1.request", "Request.spec_token_ids"),
                         Symbol("vllm.v1.request", "Request.is_prefill_chunk"))),
     async_placeholders.make),
)
