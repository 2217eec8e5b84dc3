"""The depth of joining requests' first drafts (adaptive/first_drafts.py)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.first_drafts import MIN_TRIALS, PROBE_EVERY, FirstDraftDepth

pytestmark = pytest.mark.unit

LATER = (0.65, 0.5, 0.7, 0.75)  # later drafts' conditional acceptance per position


def _seen(rate_per_request: int, n: int = 16, k: int = 4) -> FirstDraftDepth:
    """16 arrivals' first drafts verified at K = ``k``, ``rate_per_request`` of them accepting
    their first position (and nothing deeper)."""
    f = FirstDraftDepth(4)
    accepted = np.zeros(n, dtype=int)
    accepted[:rate_per_request] = 1
    f.observe(np.full(n, k), accepted)
    return f


def test_no_limit_before_enough_first_drafts_were_verified():
    f = FirstDraftDepth(4)
    assert f.depth(3, LATER) is None
    f.observe(np.full(int(MIN_TRIALS) - 1, 4), np.zeros(int(MIN_TRIALS) - 1, dtype=int))
    assert f.depth(3, LATER) is None
    f.observe(np.full(4, 4), np.zeros(4, dtype=int))
    assert f.depth(3, LATER) == 0


def test_first_drafts_that_rarely_pass_are_not_drafted():
    """1 of 16 first positions accepted (0.12 with the prior; the CPU host's fixtures: 0.12
    at K = 1): below the survival of the deepest draft asked of the decoding requests at
    K = 1..4 (0.65 ... 0.17), so none is drafted; at K = 0 there is nothing to cut.  2 of
    16 (0.18) clears K = 4's deepest draft (0.17): one first draft there."""
    f = _seen(1)
    assert [f.depth(k, LATER) for k in (1, 2, 3, 4)] == [0, 0, 0, 0]
    assert f.depth(0, LATER) is None
    assert _seen(2).depth(4, LATER) == 1


def test_first_drafts_as_good_as_later_ones_keep_the_decisions_k():
    """First drafts accepted like later ones: no limit; accepted at a position but rejected
    after it: drafted to that position only where the decision asks deeper."""
    f = FirstDraftDepth(4)
    for _ in range(4):
        f.observe(np.full(16, 4), np.full(16, 4))
    assert f.depth(4, LATER) is None
    g = FirstDraftDepth(4)
    for _ in range(4):
        g.observe(np.full(16, 4), np.ones(16, dtype=int))  # position 1 always, 2 never
    assert g.depth(1, LATER) is None
    assert g.depth(3, LATER) == 1


def test_every_eighth_decision_with_joiners_drafts_them_fully():
    """The probe keeps the first drafts' estimate measured once they are cut."""
    f = _seen(0, n=32)
    depths = [f.depth(3, LATER) for _ in range(3 * PROBE_EVERY)]
    assert depths.count(None) == 3
    assert all(d == 0 for i, d in enumerate(depths) if (i + 1) % PROBE_EVERY)
