"""The vLLM-HUST 0.17 worker wrap (``hust-draft-k``, runtime/hust_drafter.py): the drafter's K
for one call, and its ``[B, K']`` drafts padded back to the runner's Kmax buffer.

The GPU model runner and its EAGLE / draft-model proposers cannot run here (no GPU; 0.17's
CPU runner refuses speculative decoding), so the runner and its drafter are imitated by small
stand-ins that hold the attributes the wrap reads and draft the way the 0.17 proposer does
(``num_speculative_tokens`` columns, ``[B, K]`` int tensor).  The wrap on the real 0.17
``GPUModelRunner`` method with its real n-gram proposer runs in
tests/packaging/test_hust017_scheduler.py.
"""

from __future__ import annotations

import types

import pytest
import torch

from vllm_hust_vspec.runtime.hust_drafter import STEP_K_ATTR, k_attribute, pad_to, propose_with_k

pytestmark = pytest.mark.unit

KMAX = 4


class Drafter:
    """Drafts ``num_speculative_tokens`` tokens per request, as 0.17's base proposer does."""

    def __init__(self, **attrs: object) -> None:
        self.num_speculative_tokens = KMAX
        self.parallel_drafting = False
        self.widths: list[int] = []
        self.__dict__.update(attrs)

    def propose(self, batch: int) -> torch.Tensor:
        self.widths.append(self.num_speculative_tokens)
        k = self.num_speculative_tokens
        return (torch.arange(batch * k, dtype=torch.int64).view(batch, k) + 100)


def runner(method: str = "eagle", **drafter: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_spec_tokens=KMAX, drafter=Drafter(**drafter),
                                 speculative_config=types.SimpleNamespace(method=method))


def output(k: int | None) -> types.SimpleNamespace:
    so = types.SimpleNamespace()
    if k is not None:
        setattr(so, STEP_K_ATTR, k)
    return so


def test_the_drafter_drafts_the_steps_k_and_the_result_is_padded_to_kmax() -> None:
    r = runner()
    drafts = propose_with_k(r, output(2), lambda: r.drafter.propose(3))
    assert r.drafter.widths == [2]
    assert r.drafter.num_speculative_tokens == KMAX  # restored
    assert drafts.shape == (3, KMAX) and drafts.dtype == torch.int64
    assert drafts.tolist() == [[100, 101, 0, 0], [102, 103, 0, 0], [104, 105, 0, 0]]
    # the runner reads row i's first K drafts at flat index i * Kmax (stride Kmax)
    flat = drafts.flatten()
    assert [flat[i * KMAX: i * KMAX + 2].tolist() for i in range(3)] == [
        [100, 101], [102, 103], [104, 105]]


def test_k0_drafts_one_token_and_kmax_or_no_k_leaves_the_drafter_alone() -> None:
    r = runner("draft_model")
    assert propose_with_k(r, output(0), lambda: r.drafter.propose(1)).tolist() == [[100, 0, 0, 0]]
    assert propose_with_k(r, output(KMAX), lambda: r.drafter.propose(1)).shape == (1, KMAX)
    assert propose_with_k(r, output(None), lambda: r.drafter.propose(1)).shape == (1, KMAX)
    assert r.drafter.widths == [1, KMAX, KMAX]


def test_the_drafters_k_is_restored_when_it_raises() -> None:
    r = runner()

    def boom() -> None:
        assert r.drafter.num_speculative_tokens == 1
        raise RuntimeError("drafter failed")

    with pytest.raises(RuntimeError, match="drafter failed"):
        propose_with_k(r, output(1), boom)
    assert r.drafter.num_speculative_tokens == KMAX


@pytest.mark.parametrize(("method", "drafter", "expected"), [
    ("eagle", {}, "num_speculative_tokens"),
    ("mtp", {}, "num_speculative_tokens"),
    ("ngram", {"k": KMAX}, "k"),
    ("eagle", {"parallel_drafting": True}, None),  # its slots per request are fixed
    ("eagle", {"tree_choices": [(0,), (1,), (0, 0)]}, None),  # a tree drafts its nodes
    ("eagle", {"tree_choices": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]}, "num_speculative_tokens"),
    ("suffix", {}, None),  # the proposer asserts K == Kmax
    ("medusa", {}, None),
])
def test_which_drafters_take_a_k(method: str, drafter: dict, expected: str | None) -> None:
    assert k_attribute(method, Drafter(**drafter)) == expected


def test_a_drafter_that_takes_no_k_drafts_kmax() -> None:
    r = runner("eagle", parallel_drafting=True)
    assert propose_with_k(r, output(1), lambda: r.drafter.propose(2)).shape == (2, KMAX)
    assert r.drafter.widths == [KMAX]


def test_lists_pass_unpadded() -> None:
    assert pad_to([[1, 2], []], KMAX) == [[1, 2], []]
    t = torch.ones(2, KMAX, dtype=torch.int32)
    assert pad_to(t, KMAX) is t
