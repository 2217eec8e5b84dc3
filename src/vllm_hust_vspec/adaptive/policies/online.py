"""``online`` (the default): maximise expected goodput from online estimates.

For the current batch size B and every candidate K in ``[min_gamma, kmax]``::

    goodput(K) = B * E(K) / cost(B, K)        E(K) = 1 + sum_{j<=K} prod_{i<=j} a_i

with ``a_i`` from the shared :class:`~..estimators.AcceptanceEstimator` and ``cost`` from the
structural :class:`~..estimators.StepCostModel` (so a K never tried at this batch size is
still priced).  No offline profile is needed.

Decision rule, in order:

1. **Warm-up**: the first ``3 * warmup_samples`` decisions probe ``kmax``, ``min_gamma`` and
   the middle of the range (``warmup_samples`` times each), so both models see spread K.
   When the step-cost model was seeded before the first decision (the start-up cost probe,
   ``startup_cost/probe.py``), every K is priced already and the warm-up is ``kmax``
   ``warmup_samples`` times: the acceptance of every draft position, nothing more (on a
   fresh demo server its batch-1 warm-up had spent 2 of 6 steps at K = 0, each followed by a
   drafter catch-up).
2. **Probe** (exploration): after warm-up, probe slots come every ``s_i`` decisions, with
   ``s_i = min(S, 2 + i // 4)`` (i = decisions since warm-up, so probing is dense at first)
   and ``S = round(1 / exploration)``; after a warm-up on a seeded cost model every slot is
   ``S`` apart, the first ``S`` after the warm-up (the dense start re-measured costs the
   start-up probe had measured: in a fresh demo server 4 of online's first 12 batch-1
   decisions ran K = 0, at half the goodput of K = 3, each followed by a drafter catch-up).
   Slot number ``p`` probes ``candidates[p % n]`` (n = number of candidates).  Hence *every K in [min_gamma, kmax] is chosen at least once
   in any window of ``W = n * S`` consecutive decisions after warm-up* (such a window holds
   at least n consecutive probe slots, which name every candidate).
   A probe above the held K is *partial*: a rotating ``ceil(B * PROBE_FRACTION)`` of the
   requests draft the probed K (so the batch K is the probed K) and the rest keep the held
   K, which measures deep positions and the draft cost at a fraction of the verify cost.
   A probe at or below the held K is batch-wide.  Probes ignore hysteresis and
   ``max_gamma_step`` (one-step measurements) and do not change the held K.
   With ``exploration = 0`` there are no probes, except while the held K is 0, where a probe
   still comes every ``ZERO_RESUME_PERIOD`` decisions so speculation can always resume.
3. **Measure where the cost model only extrapolates**: while fewer than ``UNCERTAIN_TIMED``
   Ks have a recent step time near the current batch size
   (:meth:`~..estimators.StepCostModel.support` at least ``SUPPORT_MIN``: not so on a
   fresh server, nor at a load the engine has not served lately; the start-up cost probe's
   seeded step times price K but are no such evidence), an untimed K runs
   batch-wide for one step (two when it resumes from K = 0: the first also catches the
   drafter up and is not timed), at most one measurement every ``UNCERTAIN_SPACING``
   decisions and of one K every ``UNCERTAIN_COOLDOWN``, none with exploration 0.  Once one
   K is timed there, only a K predicted within ``UNCERTAIN_MARGIN`` of the best, or next to
   the best, is measured (one the measurement could make the choice).  Without it, a roofline fitted at other batch sizes prices K there by
   extrapolation alone, and the held K is the only one the engine then times: measured on
   the CPU host, online held K = 0 at batch 4 for 538 of its 2992 decisions while K = 2..3
   ran 35% faster there.
4. **Exploit**: ``best = argmax goodput`` (ties: smaller K).  Switch from the held K only if
   ``goodput(best) > goodput(held) * (1 + hysteresis)`` and the gain is larger than the
   step-cost model's own error in the two Ks' cells at this batch (``switch_error``
   standard deviations of the log cost ratio; ``adaptive_switch_error``, default 0.5),
   moving at most ``max_gamma_step``.  Why the error:
   at batch 14-16 on the CPU host the predicted goodput ratio of K = 1 to K = 0 moved by
   4-7 % (sd) from one decision to the next as noisy step times entered the cost cells,
   and online switched on 28-50 of its 230-300 decisions there, between K = 0, 1 and 2,
   each switch claiming a gain of 1-27 % (median 4-6 %).  A gain inside the error holds
   the K; the probes and measurements (rules 2-3) keep narrowing it.  Why 0.5 standard
   deviations: in the simulator (7 kinds x seeds 3-7) 0, 0.5 and 1 gave online / best
   fixed K 1.0114, 1.0124 and 1.0119 on average, and 1 missed the 0.98 target on a batch-2
   cell of the goodput-target seeds (0.978, against 0.981 without); on a noisy batch-16
   tie (``tests/unit/test_policies.py``) 0.5 cut the switches from 221 to 71 in 3 x 400
   decisions, 1 to 16.
   While the drafter has tokens to catch up (it sat out K = 0 steps: the batch's
   ``catch_up_tokens``), every K > 0 also pays that catch-up, priced (a fixed part and a
   part per token) from the resumes measured so far (:class:`~..estimators.CatchUpCost`)
   and spread over
   ``RESUME_HORIZON`` decisions.  Without it the policy resumed at ties: measured on the
   CPU host at batch 16, K = 0 and K = 1 gave the same goodput (0.354 / 0.353 tok/ms), one
   server switched between them 60 times, and each return caught up the prompts and tokens
   of 16 requests (15,351 tokens in one server) at a price nothing charged: online ran at
   0.80-0.92 x target-only at concurrency 16.

5. **Settle a hold inside the error by measuring**: when rule 4 holds the K against a
   better-predicted contender only because the gain is inside the error, and the
   contender's own batch-uniform cell has fewer served samples than the held K's (and fewer
   than ``SETTLE_SAMPLES``), the contender runs for two steps (on the real engine a step
   verifies the K of the step before: the second is timed in the contender's own cell), at
   most once every ``SETTLE_COOLDOWN`` decisions a K, none with exploration 0.  The
   contender is predicted better, so the steps cost nothing in expectation; the held K
   does not change.  Why: a K tried one step at a time never fills its own cell, so its
   price stayed the roofline's and its error the roofline's misfit, and the hold lasted
   until a probe slot.  In a simulated run of ``tests/host/test_plugin_serve.py``'s two
   phases (batch 16 at K = 0, then batch 1 where K = 4 is best; step times 15 or 30 %
   noisy, the start-up probe's batch-1 price of K >= 2 true or 1.4x; 8 seeds each,
   ``tests/unit/test_policies.py::_hard_then_code``) online's late mean K at batch 1 was
   below 1.75 on 9 of 32 runs (1.01 on 5) without this rule, the cost model's batch factor
   (:meth:`~..estimators.StepCostModel.batch_factor`) and the acceptance counts' volume
   cap, and at least 1.86 with them (3.29 on average); a clean-clone
   CI run of that test held K = 1 on code (late mean K 1.27 where 1.75 is due).  Over the
   generated traces (``scripts/sim_table.py --seeds 8``) online / best fixed K stayed
   1.0115 on average (1.0117 before), every target met.

Defaults (settings.py): exploration 0.01 -> S = 100, W = 900 decisions at kmax 8, min 0;
hysteresis 0.01; the held K starts at the middle of the range (``start_gamma`` /
``online:K`` overrides).

K = 0 gives no acceptance information; the acceptance counts decay with time, so estimates
revert to their (optimistic, chained) prior, and probes re-measure them: there is no latch.
"""

from __future__ import annotations

import math

from ..observations import BatchView, Decision
from .base import Policy, PolicyContext, decision, goodput_table

ZERO_RESUME_PERIOD = 200  # probe spacing while held at K=0 with exploration = 0
PROBE_FRACTION = 0.25  # share of the batch that drafts an upward probe's K
# measuring where the cost model only extrapolates (rule 3)
SUPPORT_MIN = 0.5  # evidence (aged, count-capped step times) that makes a K "timed" near a
#                    batch: one step time counts until it is a cost-model half-life old
UNCERTAIN_TIMED = 3  # Ks timed near a batch after which it is known (the best, neighbours)
UNCERTAIN_SPACING = 3  # decisions between two measurements
UNCERTAIN_MARGIN = 0.2  # a K predicted further below the best (and not next to it) is skipped
UNCERTAIN_COOLDOWN = 32  # decisions before the same K is measured again (an untimed attempt)
RESUME_HORIZON = 32  # decisions a switch from K = 0 is priced to hold (its catch-up spread)
SETTLE_COOLDOWN = 8  # decisions between two settling measurements of the same K (rule 5)
SETTLE_SAMPLES = 4.0  # served samples of a K's own cell past which its price is known (rule 5)


class OnlinePolicy(Policy):
    name = "online"
    trusted = True
    cuts_first_drafts = True
    uses_step_costs = True  # the start-up cost probe seeds ctx.cost

    def __init__(self, kmax: int, min_gamma: int = 0, start_gamma: int | None = None) -> None:
        if not 0 <= min_gamma <= kmax:
            raise ValueError(f"policy 'online': min_gamma={min_gamma} not in [0, {kmax}]")
        self.candidates = list(range(min_gamma, kmax + 1))
        mid = (min_gamma + kmax) // 2
        start = mid if start_gamma is None else start_gamma
        if not min_gamma <= start <= kmax:
            raise ValueError(
                f"policy 'online': start K={start} is out of range [{min_gamma}, {kmax}]"
            )
        self.held = start
        self.n = 0  # decisions made by this policy
        self.warmup_done_at: int | None = None
        self.next_probe = 0  # decision index (since warm-up) of the next probe slot
        self.probe_ptr = 0
        self.probe_rot = 0  # rotates the requests that draft a partial probe
        self._warm_order: list[int] | None = None
        self._measured_at: dict[int, int] = {}  # K -> decision index of its last measurement
        self._measuring: int | None = None  # a two-step measurement: its second step's K
        self._settled_at: dict[int, int] = {}  # K -> decision index of its last settling

    # -- helpers
    def probe_spacing(self, exploration: float, since_warmup: int = 1 << 30,
                      dense_start: bool = True) -> int | None:
        """Decisions between two probe slots (None: no probes); ``dense_start``: closer
        slots just after the warm-up (``2 + i // 4``)."""
        if exploration > 0:
            full = max(1, round(1.0 / exploration))
        elif self.held == 0:
            full = ZERO_RESUME_PERIOD
        else:
            return None
        return min(full, 2 + since_warmup // 4) if dense_start else full

    def revisit_window(self, exploration: float) -> int | None:
        """W: every candidate is chosen at least once in any W decisions after warm-up."""
        if exploration <= 0:
            return None
        return max(1, round(1.0 / exploration)) * len(self.candidates)

    def _probe(self, k: int, batch: BatchView, ctx: PolicyContext, why: str) -> Decision:
        ids = batch.req_ids
        b = len(ids)
        held = self.held
        if k <= held or b <= 1:
            return decision(ctx, k, self.name, f"{why} k={k}", batch_size=b)
        m = -(-b * PROBE_FRACTION // 1)
        m = int(m) if m >= 1 else 1
        if m >= b:
            return decision(ctx, k, self.name, f"{why} k={k}", batch_size=b)
        start = self.probe_rot % b
        self.probe_rot += m
        k_i = dict.fromkeys(ids, held)
        for j in range(start, start + m):
            k_i[ids[j % b]] = k
        return decision(ctx, k, self.name, f"{why} k={k} on {m}/{b}", k_i=k_i, batch_size=b)

    # -- policy
    def decide(self, batch: BatchView, ctx: PolicyContext) -> Decision:
        n = self.n
        self.n += 1
        b = len(batch.req_ids)
        if self._measuring is not None:  # a two-step measurement (resume, settle): step 2
            k, self._measuring = self._measuring, None
            return decision(ctx, k, self.name, f"measure k={k} (2/2) at batch ~{b}",
                            batch_size=b)
        scheduled = self._scheduled_probe(n, batch, ctx)
        if scheduled is not None:
            return scheduled
        if b == 0:
            return decision(ctx, self.held, self.name, "empty batch: hold", batch_size=0)
        table = goodput_table(ctx, b, self.candidates)
        if table is None:
            return decision(
                ctx, self.held, self.name, "hold: no step times yet", batch_size=b
            )
        gp, costs = table
        last = max(self._measured_at.values(), default=-UNCERTAIN_SPACING)
        if ctx.exploration > 0 and n - last >= UNCERTAIN_SPACING:
            uncertain = self._uncertain(b, gp, n, ctx)
            if uncertain is not None:
                self._measured_at[uncertain] = n
                if uncertain > 0 and ctx.last_k == 0:
                    # a resume from K = 0: its first step also catches the drafter up and
                    # is not timed; the second is
                    self._measuring = uncertain
                return decision(ctx, uncertain, self.name,
                                f"measure k={uncertain}: no recent step time at batch ~{b}",
                                batch_size=b)
        resume = self._resume_ms(batch, ctx)
        if resume:
            # a K > 0 first catches the drafter up: its price, spread over the decisions a
            # switch holds, is added to each K > 0's step cost
            lo = self.candidates[0]
            gp = [g if k == 0 else g * costs[k - lo] / (costs[k - lo] + resume / RESUME_HORIZON)
                  for k, g in enumerate(gp, lo)]
        k, reason, contender = self._exploit(gp, ctx, b)
        settle = self._settle(n, b, ctx, contender)
        if settle is not None:
            # rule 5: the held K won only by the error of a less known contender: time it
            self._settled_at[settle] = n
            self._measuring = settle
            return decision(ctx, settle, self.name, f"settle k={settle} (1/2): {reason}",
                            batch_size=b)
        if resume:
            reason += f" (resume {resume:.0f} ms)"
        return Decision(
            k=k,
            k_i=None,
            policy=self.name,
            reason=reason,
            est_accept=ctx.acceptance.estimate(),
            est_cost_ms=costs[k - self.candidates[0]],
            est_costs=tuple(costs),
            est_goodput=tuple(gp),
            est_first_k=self.candidates[0],
        )

    def _scheduled_probe(self, n: int, batch: BatchView, ctx: PolicyContext) -> Decision | None:
        """The warm-up or probe decision due at decision ``n`` (rules 1 and 2 of the module
        docstring), else None; advances the probe schedule."""
        cands = self.candidates
        if self._warm_order is None:
            lo, hi = cands[0], cands[-1]
            if ctx.cost.ready:
                # the start-up cost probe priced every K already: the warm-up is for the
                # acceptance of every draft position, which Kmax alone measures
                spread = [hi]
            else:
                spread = list(dict.fromkeys((hi, lo, (lo + hi) // 2)))
            self._warm_order = spread * ctx.warmup_samples
        if n < len(self._warm_order):
            return self._probe(
                self._warm_order[n], batch, ctx, f"warmup {n + 1}/{len(self._warm_order)}"
            )
        # a model seeded before serving (the start-up cost probe) priced every K already:
        # no dense probing after the warm-up, the first probe slot comes a spacing later
        dense = not ctx.cost.n_seeded
        if self.warmup_done_at is None:
            self.warmup_done_at = n
            if not dense:
                self.next_probe = self.probe_spacing(ctx.exploration, dense_start=False) or 0
        after = n - self.warmup_done_at
        if after >= self.next_probe:
            spacing = self.probe_spacing(ctx.exploration, after, dense)
            if spacing is not None:
                self.next_probe = after + spacing
                if after > 0 or ctx.exploration > 0:
                    k = cands[self.probe_ptr % len(cands)]
                    self.probe_ptr += 1
                    return self._probe(k, batch, ctx, "probe")
            else:
                self.next_probe = after + 1
        return None

    def _uncertain(self, b: int, gp: list[float], n: int, ctx: PolicyContext) -> int | None:
        """The K worth one measurement at batch ~``b`` (rule 3), or None: while fewer than
        ``UNCERTAIN_TIMED`` Ks have a recent step time near this batch, an untimed K whose
        predicted goodput is within ``UNCERTAIN_MARGIN`` of the best or that is next to the
        best (with nothing timed here and no seeded prior, any K), not measured in the last
        ``UNCERTAIN_COOLDOWN`` decisions, the least supported first."""
        support = ctx.cost.support(b, self.candidates)
        timed = sum(1 for x in support if x >= SUPPORT_MIN)
        if timed >= UNCERTAIN_TIMED:
            return None
        best = max(range(len(gp)), key=gp.__getitem__)
        # a model seeded before serving (the start-up cost probe) prices every K here from
        # measurements, not by extrapolation: only contenders are worth a step, as once a K
        # is timed here
        informed = timed or ctx.cost.n_seeded
        floor = gp[best] / (1.0 + UNCERTAIN_MARGIN) if informed else 0.0
        lo = self.candidates[0]
        open_ = [i for i, x in enumerate(support)
                 if x < SUPPORT_MIN and (gp[i] >= floor or abs(i - best) == 1)
                 and n - self._measured_at.get(i + lo, -UNCERTAIN_COOLDOWN) >= UNCERTAIN_COOLDOWN]
        if not open_:
            return None
        return self.candidates[min(open_, key=support.__getitem__)]

    @staticmethod
    def _resume_ms(batch: BatchView, ctx: PolicyContext) -> float:
        """What drafting K > 0 now would cost first: the drafter's catch-up of the tokens it
        missed in K = 0 steps (``batch.catch_up_tokens``) at the measured price per token
        (``ctx.catch_up``); 0 when nothing is missed or no resume was measured yet."""
        tokens = batch.catch_up_tokens
        if tokens <= 0:
            return 0.0
        price = ctx.catch_up.price(tokens)
        return 0.0 if price is None else price

    def _settle(self, n: int, b: int, ctx: PolicyContext, best: int | None) -> int | None:
        """Rule 5: ``best``, the contender that rule 4 held the K against only by the
        estimates' error (None: none), when its price is the less known of the two (its own
        cell has fewer served samples than the held K's, and fewer than ``SETTLE_SAMPLES``)
        and it was not settled in the last ``SETTLE_COOLDOWN`` decisions, else None."""
        if best is None or ctx.exploration <= 0:
            return None
        if n - self._settled_at.get(best, -SETTLE_COOLDOWN) < SETTLE_COOLDOWN:
            return None
        samples = getattr(ctx.cost, "cell_samples", None)
        if samples is None:
            return None
        n_held, n_best = samples(b, (self.held, best))
        return best if n_best < SETTLE_SAMPLES and n_best < n_held else None

    def _exploit(self, gp: list[float], ctx: PolicyContext,
                 b: int) -> tuple[int, str, int | None]:
        """Rule 4: K (and the reason) from the goodput of every candidate; moves the held K
        only past the hysteresis and past the estimates' own error (:meth:`_error`).  The
        third item is the better-predicted K held off only by that error (rule 5), else
        None."""
        held = self.held
        lo = self.candidates[0]
        best_i = 0
        best_g = gp[0]
        for i in range(1, len(gp)):
            if gp[i] > best_g:
                best_g = gp[i]
                best_i = i
        best = best_i + lo
        g_held = gp[held - lo]
        if best == held:
            return held, f"best k={best} {best_g:.4g} tok/ms", None
        if best_g > g_held * (1.0 + ctx.hysteresis):
            gain = best_g / g_held - 1.0 if g_held > 0 else math.inf
            error = self._error(ctx, b, held, best)
            if math.log1p(gain) <= error:
                return held, (f"hold k={held}: best k={best} +{gain:.1%} within the "
                              f"estimates' error {math.expm1(error):.1%}"), best
            step = ctx.max_gamma_step
            k = best if abs(best - held) <= step else held + (step if best > held else -step)
            if k == best:
                reason = f"switch {held}->{k}: +{gain:.1%} tok/ms"
            else:
                reason = f"step {held}->{k} toward {best} (+{gain:.1%})"
            self.held = k
            return k, reason, None
        gain = best_g / g_held - 1.0 if g_held > 0 else 0.0
        return held, f"hold k={held}: best k={best} only +{gain:.1%}", None

    @staticmethod
    def _error(ctx: PolicyContext, b: int, held: int, best: int) -> float:
        """``ctx.switch_error`` standard deviations of ``log(cost(best) / cost(held))`` at batch
        ``b`` as the step-cost model knows it (:meth:`~..estimators.StepCostModel.rel_error`
        of the two Ks' cells); 0 for a cost model without an error estimate.  The
        acceptance estimates' own sampling error is left out: counted too (binomial, by
        the delta method), it held batch-2 simulator cells at a too shallow K (online /
        best fixed 0.996 -> 0.978 on stationary-high seed 2), where the probes correct
        the acceptance estimates quickly."""
        rel = getattr(ctx.cost, "rel_error", None)
        if rel is None or ctx.switch_error <= 0:
            return 0.0
        e_held, e_best = rel(b, (held, best))
        return ctx.switch_error * math.sqrt(e_held * e_held + e_best * e_best)

    def describe(self) -> dict:
        return {"name": self.name, "candidates": [self.candidates[0], self.candidates[-1]]}
