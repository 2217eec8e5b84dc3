"""Patch ``GPUModelRunner._get_spec_decode_draft_probs``: hand the lossy acceptance rules
what only the runner knows.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner._get_spec_decode_draft_probs``
        (``_sample`` calls it just before the rejection sampler, with the step's
        ``SpecDecodeMetadata``).  When the plugin settings set a lossy rule, it attaches to
        that metadata the rules for this runner's method and each request's output tokens
        so far (``InputBatch.num_tokens_no_spec - num_prompt_tokens``, in the batch's
        order), for ``lossy-accept``.  Otherwise it only calls the host.
Why:    the rules' "strict for the first N output tokens" needs the requests' lengths, which
        the rejection sampler is not given; ``_sample`` itself is ``sample-no-drafts``'.
Remove: with ``lossy-accept``.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"
_BATCH = "vllm.v1.worker.gpu_input_batch"
ATTR = "vspec_lossy"  # on SpecDecodeMetadata: (Rules, output lengths)

SPEC = PatchSpec(
    name="lossy-accept-context",
    target=Symbol(_RUNNER, "GPUModelRunner._get_spec_decode_draft_probs",
                  params=("spec_decode_metadata",)),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner.input_batch"),
        Symbol(_RUNNER, "GPUModelRunner.speculative_config"),
        Symbol(_BATCH, "InputBatch.num_tokens_no_spec"),
        Symbol(_BATCH, "InputBatch.num_prompt_tokens"),
    ),
    process=PROCESS_WORKER,
    why="the lossy acceptance rules need each request's output length",
    remove_when="with lossy-accept",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec import settings as settings_mod
    from vllm_hust_vspec.runtime.lossy_accept import Rules

    @functools.wraps(original)
    def _get_spec_decode_draft_probs(self: Any, spec_decode_metadata: Any, *args: Any,
                                     **kwargs: Any) -> Any:
        rules = self.__dict__.get("_vspec_lossy_rules")
        if rules is None:  # once per runner: the settings of the engine it belongs to
            method = str(getattr(self.speculative_config, "method", ""))
            rules = Rules.from_settings(settings_mod.from_env(), method)
            self.__dict__["_vspec_lossy_rules"] = rules
        if rules.lossy and spec_decode_metadata is not None:
            batch = self.input_batch
            lengths = (batch.num_tokens_no_spec - batch.num_prompt_tokens).copy()
            setattr(spec_decode_metadata, ATTR, (rules, lengths))
        return original(self, spec_decode_metadata, *args, **kwargs)

    return _get_spec_decode_draft_probs
