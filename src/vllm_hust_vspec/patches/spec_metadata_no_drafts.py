"""Patch ``GPUModelRunner._calc_spec_decode_metadata``: a step without drafts gets its
speculative metadata without the host's index arithmetic.

What:   wraps ``vllm.v1.worker.gpu_model_runner.GPUModelRunner._calc_spec_decode_metadata``
        (CPUModelRunner inherits it); when no request of the step carries a draft token
        (every ``num_draft_tokens`` is 0: a K = 0 step), it builds the same
        ``SpecDecodeMetadata`` directly: one sampled position per request, the last
        scheduled token of each (``cu_num_scheduled_tokens - 1``), bonus indices
        ``0..n-1``, no draft or target index.  Same values and dtypes as the host's
        (``tests/host/test_spec_metadata.py`` compares them field by field on the real
        runner).
Why:    vLLM builds the speculative metadata on every step once a speculative config exists
        (``use_spec_decode = self.speculative_config is not None``); for a K = 0 step that is
        two batched cumsum-and-arange passes, five host-to-device copies and two gathers of
        the input ids, all for empty draft indices: measured 0.26 ms a step at batch 1 on the
        CPU host (about 1 % of a step of the large fixture pair), part of what K = 0 cost over
        target-only.
Remove: when vLLM skips the speculative metadata of steps without drafts.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_RUNNER = "vllm.v1.worker.gpu_model_runner"

SPEC = PatchSpec(
    name="spec-metadata-no-drafts",
    target=Symbol(_RUNNER, "GPUModelRunner._calc_spec_decode_metadata",
                  params=("num_draft_tokens", "cu_num_scheduled_tokens")),
    requires=(
        Symbol(_RUNNER, "GPUModelRunner.device"),
        Symbol(_RUNNER, "GPUModelRunner.input_ids"),
        Symbol(_RUNNER, "async_tensor_h2d"),
        Symbol("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.logits_indices"),
        Symbol("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.bonus_logits_indices"),
    ),
    process=PROCESS_WORKER,
    why="a K = 0 step's speculative metadata without the index arithmetic of drafts it has not",
    remove_when="vLLM skips the speculative metadata of steps without drafts",
)


def make(original: Any) -> Any:
    import numpy as np

    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker import gpu_model_runner as host

    @functools.wraps(original)
    def _calc_spec_decode_metadata(self: Any, num_draft_tokens: Any,
                                   cu_num_scheduled_tokens: Any) -> Any:
        if num_draft_tokens.any():
            return original(self, num_draft_tokens, cu_num_scheduled_tokens)
        n = len(num_draft_tokens)
        h2d = host.async_tensor_h2d
        device = self.device
        # the host's dtypes: its cumsums and draft indices are int32, its logits indices
        # cu_num_scheduled_tokens - num_sampled_tokens (num_sampled_tokens = drafts + 1)
        counts = np.arange(n + 1, dtype=np.int32)
        logits_indices = cu_num_scheduled_tokens - (num_draft_tokens + 1)
        return SpecDecodeMetadata(
            draft_token_ids=self.input_ids.gpu.new_empty(0),
            num_draft_tokens=num_draft_tokens.tolist(),
            cu_num_draft_tokens=h2d(np.zeros(n, dtype=np.int32), device=device),
            cu_num_sampled_tokens=h2d(counts[1:], device=device),
            target_logits_indices=h2d(np.zeros(0, dtype=np.int32), device=device),
            bonus_logits_indices=h2d(counts[:-1], device=device),
            logits_indices=h2d(logits_indices, device=device),
        )

    return _calc_spec_decode_metadata
