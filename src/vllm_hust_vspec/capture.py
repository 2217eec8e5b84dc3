"""Graph capture sizes that cover every verify width the controller may choose.

A decode step at batch-wide K verifies ``K + 1`` tokens per request, so a uniform decode
batch of ``b`` requests is ``b * (K + 1)`` tokens.  When K varies per step, every width
``kmin + 1 .. kmax + 1`` must have captured sizes, or those steps run without graphs.
Pure functions: no vLLM, no torch.  Used by the launcher (``--capture-policy``).
"""

from __future__ import annotations

CAPTURE_POLICIES = ("auto", "exact", "power2", "steady")


def verify_widths(kmax: int, kmin: int = 0, adaptive: bool = True) -> tuple[int, ...]:
    """Query widths (tokens per request) of a decode step: ``kmax + 1`` only for a fixed
    K, every ``k + 1`` for ``k`` in ``kmin..kmax`` when the controller varies K."""
    if kmax < 0 or kmin < 0 or kmin > kmax:
        raise ValueError(f"bad K range: kmin={kmin}, kmax={kmax}")
    if not adaptive:
        return (kmax + 1,)
    return tuple(range(kmin + 1, kmax + 2))


def request_buckets(max_num_seqs: int, policy: str) -> tuple[int, ...]:
    """Batch sizes (requests) captured per width.

    auto:   1, 2, 4, then every 8 up to 256, then every 16 (vLLM's own request grid);
    exact:  every batch size up to 16, then every 8;
    power2: powers of two;
    steady: 1 and max_num_seqs only.
    max_num_seqs itself is always included."""
    b = int(max_num_seqs)
    if b < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {b}")
    if policy == "auto":
        sizes = [n for n in (1, 2, 4) if n <= b]
        sizes += list(range(8, min(b + 1, 256), 8))
        sizes += list(range(256, b + 1, 16))
    elif policy == "exact":
        sizes = list(range(1, min(b, 16) + 1)) + list(range(24, b + 1, 8))
    elif policy == "power2":
        sizes, n = [], 1
        while n <= b:
            sizes.append(n)
            n *= 2
    elif policy == "steady":
        sizes = [1]
    else:
        raise ValueError(f"unknown capture policy {policy!r} (known: {', '.join(CAPTURE_POLICIES)})")
    return tuple(sorted(set(sizes + [b])))


def capture_sizes(
    max_num_seqs: int,
    kmax: int,
    policy: str = "auto",
    kmin: int = 0,
    adaptive: bool = True,
    max_num_batched_tokens: int | None = None,
) -> list[int]:
    """Sorted token counts to capture: ``b * w`` for every request bucket ``b`` and
    verify width ``w``, without sizes above ``max_num_batched_tokens`` (when given)."""
    widths = verify_widths(kmax, kmin, adaptive)
    sizes = {b * w for b in request_buckets(max_num_seqs, policy) for w in widths}
    if max_num_batched_tokens is not None:
        sizes = {s for s in sizes if s <= max_num_batched_tokens}
    return sorted(sizes)


def covering_table(kmin: int, kmax: int, max_num_seqs: int
                   ) -> tuple[list[tuple[int, int, int]], tuple[int, ...]]:
    """A batch-size table (vLLM's ``num_speculative_tokens_per_batch_size``) in which every K
    of ``kmin..kmax`` appears, and the K values that could not appear.

    vLLM's V2 model runner captures decode graphs only for the widths ``K + 1`` its dense
    table holds; the plugin decides K itself (its lookup replaces the table's), so the table
    only has to name every K once: batch size 1 gets ``kmin``, 2 gets ``kmin + 1``, ... and
    the last range up to ``max_num_seqs`` gets ``kmax``.  With fewer batch sizes than K
    values, the smallest K values beyond the room are left out (returned), Kmax never."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs {max_num_seqs} must be >= 1")
    ks = [w - 1 for w in verify_widths(kmax, kmin)]
    kept = ks[-max_num_seqs:]  # Kmax always; the smallest K go first when room runs out
    left_out = tuple(ks[: len(ks) - len(kept)])
    table = [(i + 1, i + 1, k) for i, k in enumerate(kept[:-1])]
    table.append((len(kept), max_num_seqs, kept[-1]))
    return table, left_out
