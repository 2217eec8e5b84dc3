"""observe() + decide() cost per step at batch 256, kmax 8: <= 50 microseconds for every
policy of the registry (``fixed``, ``schedule``, ``sweep``, ``online``, ``profile``,
``budget`` with and without confidences) and the per-request stop modes (``survival``,
``confidence``, ``entropy``).

Measured as the mean over 100 steps of this thread's CPU time (so time the scheduler gives
to other processes does not count), best of 19 rounds after a warm-up round; the
per-request result objects are built outside the timed region (the engine builds them
anyway).  Both input forms are covered: one RequestResult per request (with its verified
drafts' confidences where the batch has confidences), and the array fast path
(``StepResult.drafted`` / ``accepted`` / ``confidences``).

With this harness's step cost (a drafter pass costs 12.8 ms at batch 256) ``budget`` with
confidences settles on a depth cap of 0: its rounds time the held decisions (no survival
needed) plus a re-selection every 16th decision and on every probe
(src/vllm_hust_vspec/adaptive/policies/budget.py, "Selection schedule").  The drafting
regime (a cheap drafter: depth cap 3-4, per-request K_i) is timed by
``test_budget_drafting_under_50us`` in the engine's array form (see the comment there).
Where the batch has confidences they are informative (position j accepted with
probability c_j), so the calibration learns a real map."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vllm_hust_vspec.adaptive import (
    BatchView,
    Controller,
    ControllerConfig,
    RequestResult,
    StepResult,
    ki_array,
)
from vllm_hust_vspec.adaptive.generators import generate
from vllm_hust_vspec.adaptive.policies import registry
from vllm_hust_vspec.adaptive.policies.stop import STOP_MODES
from vllm_hust_vspec.adaptive.simulate import profile_for_trace

pytestmark = pytest.mark.unit

B = 256
KMAX = 8
BUDGET_US = 50.0


def _run(policy: str, conf: bool = False, arrays: bool = False, ent: bool = False,
         cheap_draft: bool = False, steps: int = 100, rounds: int = 20,
         **kw) -> tuple[float, list[np.ndarray]]:
    """Best mean us per step over the rounds, and the K_i arrays of the last round."""
    rng = np.random.default_rng(0)
    ids = tuple(f"req-{i}" for i in range(B))
    confs = rng.random((B, KMAX)) if conf else None
    acc_len = rng.integers(0, KMAX + 1, size=(32, B))
    if conf:  # informative confidences: position j is accepted with probability c_j
        ok = rng.random((32, B, KMAX)) < confs[None]
        acc_len = np.where(ok.all(2), KMAX, ok.argmin(2))
    # top-8 entropies in [0, ln 8): about half the positions above the default 1.0 nats
    ents = rng.random((B, KMAX)) * np.log(8.0) if ent else None
    view = BatchView(0, ids, None, confs, ents)
    ctl = Controller(ControllerConfig(kmax=KMAX, policy=policy, **kw))
    best = float("inf")
    clock = time.thread_time_ns  # CPU time of this thread: robust on a shared machine
    step = 0
    # a drafter pass: 12.8 ms at batch 256 (a drafter half the target's cost per token), or
    # 0.3 ms (a cheap drafter: budget then drafts a few positions with per-request K_i)
    draft_ms = 0.3 if cheap_draft else max(1.2, 0.05 * B)
    token_ms = 0.02 if cheap_draft else 0.3
    kis: list[np.ndarray] = []
    for rnd in range(rounds):
        spent = 0
        kis = []
        for _ in range(steps):
            t0 = clock()
            d = ctl.decide(view)
            spent += clock() - t0
            ki = np.full(B, d.k) if d.k_i is None else ki_array(d.k_i, ids)
            acc = np.minimum(ki, acc_len[step % 32])
            kis.append(ki)
            ms = 3.0 + max(18.0, token_ms * (B + int(ki.sum()))) + d.k * draft_ms
            if arrays:
                result = StepResult(step, B, d.k, (), ms, d.k, ki, acc, confs)
            else:
                kl, al = ki.tolist(), acc.tolist()
                rows = [None] * B if confs is None else [
                    tuple(confs[i, : kl[i]].tolist()) for i in range(B)]
                result = StepResult(
                    step, B, d.k,
                    tuple(RequestResult(r, kl[i], al[i], 0, rows[i]) for i, r in enumerate(ids)),
                    ms, d.k,
                )
            t0 = clock()
            ctl.observe(result)
            spent += clock() - t0
            step += 1
        if rnd:  # round 0 is warm-up (model fits while samples are few)
            best = min(best, spent / steps / 1000.0)
    return best, kis


def _mean_us(policy: str, **kw) -> float:
    return _run(policy, **kw)[0]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("speed") / "profile.json"
    profile_for_trace(generate("stationary-high", 0)).save(path)
    return str(path)


CASES = [
    ("fixed:3", {}),
    ("schedule:1-4:4,5-64:2,65-1024:1", {}),
    ("sweep", {}),
    ("online", {}),
    ("online", {"stop": "survival"}),
    ("online", {"stop": "confidence", "conf": True}),
    ("online", {"stop": "survival", "conf": True}),
    ("online", {"arrays": True}),
    ("online", {"stop": "entropy", "ent": True}),
    ("profile", {}),
    ("profile", {"stop": "survival", "conf": True}),
    ("profile", {"stop": "entropy", "ent": True}),
    ("budget", {}),
    ("budget", {"conf": True}),
    ("budget", {"conf": True, "arrays": True}),
    ("budget", {"conf": True, "stop": "confidence"}),
    ("budget", {"conf": True, "stop": "entropy", "ent": True}),
]
IDS = ["fixed", "schedule", "sweep", "online", "online+stop-survival",
       "online+stop-confidence", "online+stop-survival-conf", "online-arrays",
       "online+stop-entropy", "profile", "profile+stop-survival-conf", "profile+stop-entropy",
       "budget", "budget+conf", "budget+conf-arrays", "budget+conf+stop-confidence",
       "budget+conf+stop-entropy"]


def test_cases_cover_every_registered_policy():
    # the product's policies (other tests may register their own)
    builtin = {name for name in registry.policy_names()
               if registry._REGISTRY[name].__module__.startswith("vllm_hust_vspec.")}
    assert {_values(c)[0].split(":", 1)[0] for c in CASES} == builtin
    assert len(IDS) == len(CASES)


def test_cases_cover_every_stop_mode():
    assert {_values(c)[1].get("stop", "off") for c in CASES} == set(STOP_MODES)


def _values(case):
    return case.values if hasattr(case, "values") else case


@pytest.mark.parametrize("policy, kw", CASES, ids=IDS)
def test_observe_decide_under_50us(policy, kw, profile_path):
    kw = dict(kw)
    if policy == "profile":
        kw["profile"] = profile_path
    us = _mean_us(policy, conf=kw.pop("conf", False), arrays=kw.pop("arrays", False),
                  ent=kw.pop("ent", False), **kw)
    print(f"{policy} {kw}: {us:.1f} us/step")
    assert us <= BUDGET_US, f"{policy} {kw}: {us:.1f} us per step > {BUDGET_US}"


# ``budget`` in its drafting regime: with a cheap drafter (0.3 ms a pass, 0.02 ms a verified
# token) it settles on a depth cap of 3-4 and per-request K_i from each request's
# confidences, so every decision computes the survival of every request under the cap and
# observe() learns the confidence calibration from the verified drafts.  The engine passes
# this form (StepResult.drafted / accepted / confidences arrays, runtime/verified.py), and it
# is held to the 50 us.  The same steps as 256 RequestResult objects cost ~25-30 us more
# (2026-11-29, 2-core CPU host: reading 256 objects to count them, ~13 us, and the calibration's
# Python loop over their confidence tuples, ~13 us); that form is printed, not held to it.
def test_budget_drafting_under_50us():
    us, kis = _run("budget", conf=True, cheap_draft=True, arrays=True)
    _check_drafting(kis)
    print(f"budget drafting (arrays): {us:.1f} us/step")
    assert us <= BUDGET_US, f"budget drafting (arrays): {us:.1f} us per step > {BUDGET_US}"


def test_budget_drafting_request_objects():
    us, kis = _run("budget", conf=True, cheap_draft=True, rounds=8)
    _check_drafting(kis)
    print(f"budget drafting (RequestResult objects, not held to {BUDGET_US:g} us): {us:.1f} us/step")


def _check_drafting(kis: list[np.ndarray]) -> None:
    """The timed regime really drafts, with K_i that differ between requests."""
    drafted = [ki for ki in kis if ki.max() > 0]
    assert len(drafted) >= 0.9 * len(kis), f"only {len(drafted)}/{len(kis)} decisions draft"
    assert sum(len(np.unique(ki)) > 1 for ki in drafted) >= 0.5 * len(drafted)
    assert 1.0 <= np.mean([ki.mean() for ki in drafted]) < KMAX - 1
