"""Admission control's cohort rule (runtime/admission.py), pure Python."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_hust_vspec.runtime.admission import Admission, cohort_size


def test_the_method_cohorts_are_vspecs():
    assert cohort_size(0, "draft_model") == 8
    assert [cohort_size(0, m) for m in ("eagle", "eagle3", "mtp", "ngram")] == [4, 4, 4, 4]
    assert cohort_size(3, "draft_model") == 3
    with pytest.raises(ValueError):
        cohort_size(-1, "eagle")


def test_holds_until_a_cohort_of_slots_is_free():
    a = Admission(cohort=4, max_wait_steps=100)
    # a batch of 8 slots, 7 running, 5 waiting: one free slot < min(4, 5): hold
    assert a.limit(7, 5, 8) == 7
    assert a.limit(6, 5, 8) == 6
    assert a.limit(5, 5, 8) == 5
    assert a.limit(4, 5, 8) is None  # 4 free: the cohort goes in
    assert (a.holds, a.releases, a.held_steps) == (3, 0, 0)


def test_few_waiting_need_only_as_many_slots():
    a = Admission(cohort=4, max_wait_steps=100)
    assert a.limit(6, 2, 8) is None  # min(4, 2) = 2 slots free: admit
    assert a.limit(7, 2, 8) == 7  # one slot for two waiting: hold
    assert a.held_now == 2


def test_never_holds_an_empty_engine_a_full_one_or_nothing():
    a = Admission(cohort=8, max_wait_steps=4)
    assert a.limit(0, 20, 8) is None  # empty: start at once
    assert a.limit(8, 20, 8) is None  # full: the host admits no one anyway
    assert a.limit(5, 0, 8) is None  # nothing waits
    assert a.holds == 0 and a.held_now == 0


def test_the_starvation_bound_releases_after_max_wait_steps():
    a = Admission(cohort=4, max_wait_steps=3)
    got = [a.limit(7, 4, 8) for _ in range(8)]
    assert got == [7, 7, 7, None, 7, 7, 7, None]
    assert (a.holds, a.releases) == (6, 2)
    assert a.stats == {"admission_holds": 6, "admission_releases": 2}


def test_a_cohort_larger_than_the_batch_waits_for_an_empty_one():
    a = Admission(cohort=16, max_wait_steps=100)
    assert a.limit(1, 30, 8) == 1  # 7 free < min(16, 30, 8) = 8
    assert a.limit(0, 30, 8) is None


@given(occupied=st.integers(0, 64), waiting=st.integers(0, 64), host=st.integers(1, 64),
       cohort=st.integers(1, 16), bound=st.integers(1, 8), steps=st.integers(1, 40))
def test_it_only_ever_holds_and_never_past_the_bound(occupied, waiting, host, cohort, bound,
                                                     steps):
    occupied = min(occupied, host)
    a = Admission(cohort=cohort, max_wait_steps=bound)
    run = 0
    for _ in range(steps):
        got = a.limit(occupied, waiting, host)
        assert got is None or got == occupied  # hold = admit no one; else the host's limit
        run = run + 1 if got is not None else 0
        assert run <= bound
        if got is not None:  # holding is only ever for a cohort that could not fit
            assert 0 < occupied and waiting > 0 and host - occupied < min(cohort, waiting)
