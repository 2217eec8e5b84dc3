"""Capture sizes (pure): every verify width of the controller's K range is covered."""

from __future__ import annotations

import pytest

from vllm_hust_vspec.capture import capture_sizes, request_buckets, verify_widths

pytestmark = pytest.mark.cli


def test_verify_widths():
    assert verify_widths(4) == (1, 2, 3, 4, 5)
    assert verify_widths(4, kmin=2) == (3, 4, 5)
    assert verify_widths(4, adaptive=False) == (5,)
    with pytest.raises(ValueError):
        verify_widths(2, kmin=3)


def test_request_buckets():
    assert request_buckets(20, "auto") == (1, 2, 4, 8, 16, 20)
    assert request_buckets(300, "auto")[-3:] == (272, 288, 300)
    assert request_buckets(20, "exact") == tuple(range(1, 17)) + (20,)
    assert request_buckets(40, "exact")[-3:] == (24, 32, 40)
    assert request_buckets(20, "power2") == (1, 2, 4, 8, 16, 20)
    assert request_buckets(20, "steady") == (1, 20)
    with pytest.raises(ValueError):
        request_buckets(8, "bogus")
    with pytest.raises(ValueError):
        request_buckets(0, "auto")


def test_capture_sizes_cover_every_width():
    sizes = capture_sizes(16, 3, "power2", kmin=1)
    for b in (1, 2, 4, 8, 16):
        for w in (2, 3, 4):
            assert b * w in sizes
    assert 1 not in sizes  # K=0 excluded by kmin=1
    assert capture_sizes(4, 1, "steady", max_num_batched_tokens=4) == [1, 2, 4]
