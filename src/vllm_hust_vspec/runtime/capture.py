"""Device-graph capture sizes for every verify width (pure; the launcher reuses it).

A step that verifies K drafts for n requests runs ``n * (K + 1)`` tokens.  A graph host needs
a captured size for each width the controller may pick, not only for Kmax.
"""

from __future__ import annotations

CAPTURE_POLICIES = ("auto", "exact", "power2", "steady")


def _request_counts(max_num_seqs: int, policy: str) -> list[int]:
    if policy == "exact":
        return list(range(1, max_num_seqs + 1))
    if policy == "power2":
        out, n = [], 1
        while n < max_num_seqs:
            out.append(n)
            n *= 2
        return sorted(set(out + [max_num_seqs]))
    if policy == "steady":
        return [max_num_seqs]
    # auto: the host's own ladder (1, 2, 4, then every 8 up to 256, then every 16)
    counts = [n for n in (1, 2, 4) if n <= max_num_seqs]
    counts += list(range(8, min(max_num_seqs + 1, 256), 8))
    counts += list(range(256, max_num_seqs + 1, 16))
    return sorted(set(counts + [max_num_seqs]))


def verify_capture_sizes(kmax: int, max_num_seqs: int, limit: int | None = None,
                         policy: str = "auto") -> list[int]:
    """Sorted token counts ``n * (K + 1)`` for K in 1..Kmax and n from the policy's request
    counts up to ``max_num_seqs``; sizes above ``limit`` are dropped.

    ``policy``: ``auto`` (the host's ladder), ``exact`` (every n), ``power2`` (powers of two),
    ``steady`` (only n = max_num_seqs)."""
    if policy not in CAPTURE_POLICIES:
        raise ValueError(f"capture policy {policy!r}: expected one of {', '.join(CAPTURE_POLICIES)}")
    if kmax < 1 or max_num_seqs < 1:
        raise ValueError(f"kmax ({kmax}) and max_num_seqs ({max_num_seqs}) must be >= 1")
    sizes = {
        n * (k + 1)
        for k in range(1, kmax + 1)
        for n in _request_counts(max_num_seqs, policy)
    }
    if limit is not None:
        sizes = {s for s in sizes if s <= limit}
    return sorted(sizes)
