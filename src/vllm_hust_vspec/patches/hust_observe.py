"""``spec-stats`` and ``step-output`` declared for vLLM-HUST 0.17: what each step verified.

What:   the same wrappers as on vLLM >= 0.24 (``patches/spec_stats.py``: each request's
        drafted and accepted counts from ``Scheduler.make_spec_decoding_stats``;
        ``patches/step_output.py``: the step's wall time and results around
        ``Scheduler.update_from_output``), declared for the 0.17 family under their own names
        (``hust-spec-stats``, ``hust-step-output``) so the doctor checks them on that tree.
Why:    both host methods have the same names and parameters on 0.17 (checked statically by
        the doctor and run on the 0.17 scheduler in tests/packaging/test_hust017_scheduler.py).
Remove: when vLLM-HUST rebases onto vLLM >= 0.24 (then the originals apply).
"""

from __future__ import annotations

import dataclasses

from vllm_hust_vspec.patches import spec_stats, step_output
from vllm_hust_vspec.patchspec import FAMILY_HUST, PatchSpec

_REMOVE = "vLLM-HUST rebases onto vLLM >= 0.24 (then {} applies)"


def _for_hust(spec: PatchSpec) -> PatchSpec:
    return dataclasses.replace(spec, name="hust-" + spec.name, family=FAMILY_HUST,
                               remove_when=_REMOVE.format(spec.name))


# (spec, make) pairs: the catalog lists them beside the one-patch modules
PATCHES = ((_for_hust(spec_stats.SPEC), spec_stats.make),
           (_for_hust(step_output.SPEC), step_output.make))
