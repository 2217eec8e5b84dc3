"""How deep a request's first drafts are worth drafting.

A request's first drafts are the ones its prefill step makes (the drafter proposes from the
prompt and the first sampled token); its first decode step verifies them.  On the CPU host's
fixtures they are accepted far less often than later drafts (6-12 % a token against 43-58 %,
in vLLM with the plugin off, with it, and in transformers alike), and the decision of the
step in which a burst of requests prefills gives every one of them the batch's K: measured
in a paired server at concurrency 16 (``bench ab --paired-waves``, AVX2 EPYC, 2026-12-06), a
wave of 16 arrivals joined a batch-1 decision at K = 3, and the next step verified 48 first
drafts (5 accepted) in 127 ms where a step of the same batch at K = 1 took 78-85 ms; over
that server's trace, 213 steps verified first drafts, 176 of 2,186 accepted (0.12 a
request at K = 1, 0.27 at K = 4).

:class:`FirstDraftDepth` keeps the first drafts' own conditional acceptance per position
(an :class:`~.estimators.AcceptanceEstimator` fed only with the rows the engine marks
``StepResult.first``; the main estimate leaves them out) and gives the requests that join
the batch in a step (``BatchView.joining``) the depth whose survival is still at least that
of the deepest draft the decision asks of the decoding requests: a first draft less likely
to be accepted than any draft the policy already pays for is not drafted.  The limit only
trims drafts, so it is lossless.  Until ``MIN_TRIALS`` first drafts were verified at
position 1, and on every ``PROBE_EVERY``-th decision with joiners (so the estimate stays
measured), joiners draft the decision's K.
"""

from __future__ import annotations

import numpy as np

from .estimators import AcceptanceEstimator, position_counts_arrays

MIN_TRIALS = 8.0  # position-1 trials (decayed) before the estimate limits anything
PROBE_EVERY = 8  # every 8th decision with joiners drafts them at the decision's K


class FirstDraftDepth:
    """The depth of the first drafts of requests that join the batch (module docstring)."""

    def __init__(self, kmax: int, weight: float = 0.05) -> None:
        self.kmax = kmax
        self.acceptance = AcceptanceEstimator(kmax, weight=weight)
        self.decisions = 0  # decisions with joiners, for the probe rotation

    def observe(self, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """The rows of one step that verified requests' first drafts."""
        if not self.kmax or not len(drafted):
            return
        tried, acc, _, _ = position_counts_arrays(drafted, accepted, self.kmax)
        if tried[0]:
            self.acceptance.update_counts(tried, acc)

    def depth(self, k: int, acceptance: tuple[float, ...]) -> int | None:
        """The joiners' draft depth for a decision of batch K ``k`` whose decoding requests'
        conditional acceptance per position is ``acceptance``; None: ``k`` itself (no limit:
        too few first drafts seen yet, a probe, or every position is worth it)."""
        if k <= 0 or self.acceptance.tried[0] < MIN_TRIALS:
            return None
        self.decisions += 1
        if self.decisions % PROBE_EVERY == 0:
            return None
        floor = float(np.prod(acceptance[:k]))  # the deepest draft the decision pays for
        surv = 1.0
        depth = 0
        for a in self.acceptance.estimate()[:k]:
            surv *= a
            if surv < floor:
                break
            depth += 1
        return None if depth >= k else depth
