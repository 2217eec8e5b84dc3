"""Patch ``GPUModelRunner._sample``: a step without drafts samples as target-only does.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample`` (CPUModelRunner
        inherits it); when the step's ``SpecDecodeMetadata`` holds no draft token (every
        request drafts 0: a K = 0 step) under synchronous scheduling, the host's plain
        ``Sampler`` samples the one token per request, as without speculation, instead of
        the rejection sampler.  Its output has the rejection sampler's shape there
        ``(num_reqs, 1)``, which the host's bookkeeping parses the same way.
Why:    vLLM builds the speculative metadata whenever a speculative config exists
        (``use_spec_decode = self.speculative_config is not None``), so a K = 0 step pays
        the rejection sampler's setup for nothing (part of what K = 0 cost over target-only).
Remove: when vLLM samples K = 0 steps with the plain sampler.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"

SPEC = PatchSpec(
    name="sample-no-drafts",
    target=Symbol(_RUNNER, "GPUModelRunner._sample", params=("logits", "spec_decode_metadata")),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner.sampler"),
        Symbol(_RUNNER, "GPUModelRunner.input_batch"),
        Symbol(_RUNNER, "GPUModelRunner.use_async_scheduling"),
        Symbol("vllm.v1.worker.gpu_input_batch", "InputBatch.sampling_metadata"),
        Symbol("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.num_draft_tokens"),
    ),
    process=PROCESS_WORKER,
    why="a K = 0 step samples with the plain sampler, as target-only does",
    remove_when="vLLM samples steps without drafts with the plain sampler",
)


def make(original: Any) -> Any:
    @functools.wraps(original)
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        if (spec_decode_metadata is not None and not any(spec_decode_metadata.num_draft_tokens)
                and not self.use_async_scheduling):
            return self.sampler(logits=logits, sampling_metadata=self.input_batch.sampling_metadata)
        return original(self, logits, spec_decode_metadata)

    return _sample
