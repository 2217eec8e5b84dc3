"""Pure parts of the draft confidences: the per-position arithmetic (torch, no vLLM), the
stacking of drafting passes, and when the controller asks for confidences at all."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vllm_hust_vspec.adaptive.controller import Controller, ControllerConfig
from vllm_hust_vspec.patches import draft_confidence_signals as signals

pytestmark = pytest.mark.unit


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_from_logits_is_the_argmax_probability_and_top8_entropy():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=gen, dtype=torch.float64) * 3
    conf, ent = signals.from_logits(logits)
    assert conf.dtype == torch.float32 and ent.dtype == torch.float32 and conf.shape == (5,)
    probs = torch.softmax(logits, dim=-1).numpy()
    np.testing.assert_allclose(conf.numpy(), probs.max(axis=1), rtol=1e-5)
    for row, h in zip(probs, ent.numpy()):
        top = np.sort(row)[-8:]
        assert h == pytest.approx(_entropy(top / top.sum()), rel=1e-5)


def test_from_logits_edge_rows():
    # one dominant token: confidence ~1, entropy ~0; uniform: 1/V and ln 8; -inf entries
    # (a constrained draft vocabulary) and fewer than 8 tokens are handled
    logits = torch.tensor([[100.0, 0.0, 0.0, 0.0],
                           [1.0, 1.0, 1.0, 1.0],
                           [2.0, float("-inf"), 2.0, float("-inf")]])
    conf, ent = signals.from_logits(logits)
    np.testing.assert_allclose(conf.numpy(), [1.0, 0.25, 0.5], atol=1e-6)
    np.testing.assert_allclose(ent.numpy(), [0.0, math.log(4), math.log(2)], atol=1e-5)
    wide = torch.zeros(2, 100)
    assert signals.from_logits(wide)[1].numpy() == pytest.approx([math.log(8)] * 2)


def test_from_probs_takes_the_sampled_token():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])
    conf, ent = signals.from_probs(probs, torch.tensor([1, 3]))
    np.testing.assert_allclose(conf.numpy(), [0.3, 0.7], atol=1e-7)
    assert ent[0].item() == pytest.approx(_entropy(np.array([0.5, 0.3, 0.2])), rel=1e-6)
    assert ent[1].item() == pytest.approx(_entropy(np.array([0.1, 0.1, 0.1, 0.7])), rel=1e-6)


def test_stack_sequential_and_parallel_passes():
    drafts = torch.zeros(3, 2, dtype=torch.int64)
    seq = [(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1.0, 1.1, 1.2])),
           (torch.tensor([0.4, 0.5, 0.6]), torch.tensor([1.3, 1.4, 1.5]))]
    conf, ent = signals.stack(seq, drafts, "test")
    assert conf.dtype == np.float32 and conf.shape == (3, 2)
    np.testing.assert_allclose(conf, [[0.1, 0.4], [0.2, 0.5], [0.3, 0.6]], rtol=1e-6)
    np.testing.assert_allclose(ent[:, 1], [1.3, 1.4, 1.5], rtol=1e-6)
    # parallel drafting: one pass, K rows per request, request-major
    par = [(torch.arange(6, dtype=torch.float32) / 10, torch.zeros(6))]
    conf, _ = signals.stack(par, drafts, "test")
    np.testing.assert_allclose(conf, [[0.0, 0.1], [0.2, 0.3], [0.4, 0.5]], rtol=1e-6)
    assert signals.stack([], drafts, "test") is None


def test_stack_refuses_drafts_it_does_not_cover():
    drafts = torch.zeros(3, 3, dtype=torch.int64)
    one = [(torch.zeros(3), torch.zeros(3))]
    with pytest.raises(RuntimeError, match="MyProposer: 1 draft confidences per request for 3"):
        signals.stack(one, drafts, "MyProposer")
    with pytest.raises(RuntimeError, match="MyProposer: draft confidences of 1 drafting pass"):
        signals.stack([(torch.zeros(4), torch.zeros(4))], drafts, "MyProposer")


@pytest.mark.parametrize(("policy", "stop", "wanted"), [
    ("online", "off", False), ("fixed", "off", False), ("sweep", "off", False),
    ("schedule:1-8:2", "off", False), ("budget", "off", True),
    ("online", "confidence", True), ("online", "survival", True), ("fixed", "confidence", True),
])
def test_controller_asks_for_confidences_only_when_it_uses_them(policy, stop, wanted):
    ctl = Controller(ControllerConfig(kmax=4, policy=policy, stop=stop))
    assert ctl.wants_confidences is wanted
