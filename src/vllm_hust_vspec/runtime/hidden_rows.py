"""The target's hidden states by KV slot, for the EAGLE-family catch-up after K = 0 steps.

EAGLE, EAGLE-3 and MTP draft from the target's hidden states: the drafter's KV at position p
is computed from (token p+1, the target's hidden state at p).  When such a drafter sits out
K = 0 steps (``runtime/drafter_sync.py``), the positions it missed can be caught up only with
the hidden states the target computed for them.  They are kept here, one row per KV slot of
the drafter's cache group, written on every step (drafting or not) from the rows the host
hands the drafter: a slot's row is that of the token whose target KV the slot holds, so a
request whose prefix comes from the prefix cache, or that is recomputed after preemption,
finds the rows of its cached blocks where their KV is.  A rejected draft's slot holds a
wrong row until the next step writes that position again, as the KV cache does.

Chosen over recomputing the hidden states (a target forward over the missed positions): that
costs a target pass per resume and would write the target's KV cache again from another
batch shape.  What it costs: one row copy per scheduled token and step, and memory of
``slots x width`` (width = hidden size; three hidden sizes for EAGLE-3's auxiliary layers),
allocated on the first step and outside vLLM's KV-cache budget (logged once).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("vllm_hust_vspec")


class HiddenRows:
    """One row of the target's hidden states per KV slot of ``num_blocks`` blocks of
    ``block_size`` slots."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = int(block_size)
        self.num_slots = int(num_blocks) * self.block_size
        self.table: Any = None  # torch.Tensor [num_slots, width], on the first put

    def put(self, slots: Any, rows: Any) -> None:
        """Keep ``rows[i]`` for KV slot ``slots[i]`` (int64 tensors on the rows' device)."""
        import torch

        if self.table is None:
            # zeros, not empty: a slot no step wrote (a step too large for the drafter,
            # which the host does not draft either) feeds the drafter zeros, never NaN
            self.table = torch.zeros(self.num_slots, rows.shape[-1], dtype=rows.dtype,
                                     device=rows.device)
            mib = self.table.numel() * self.table.element_size() / 2**20
            logger.info("vllm-hust-vspec: K = 0 keeps the target's hidden states for the "
                        "drafter's catch-up: %d slots x %d (%s), %.1f MiB",
                        self.num_slots, rows.shape[-1], rows.dtype, mib)
        self.table.index_copy_(0, slots, rows.to(self.table.dtype))

    def get(self, slots: Any) -> Any:
        return self.table.index_select(0, slots)


def slots_of(table: Any, owner: Any, positions: Any, block_size: int) -> Any:
    """The KV slot of each token: row ``owner[i]`` of the block table ``table`` at
    ``positions[i]`` (int64, on the table's device)."""
    import torch

    blocks = table[owner, positions // block_size].to(torch.int64)
    return blocks * block_size + positions % block_size
