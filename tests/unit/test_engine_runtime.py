"""The engine runtime (runtime/engine.py) driven without vLLM.

The scheduler, its requests and its step outputs are plain stand-in objects that carry only
the attributes the runtime reads (the host's ``Scheduler`` needs a model to build); the
calls are the ones the patches make, in the host's order: ``schedule()`` asks the K lookup,
``update_from_output`` wraps the step's verification (``spec-stats`` reports inside it),
``update_draft_token_ids`` hands over the next drafts.  The real-host tests
(tests/host/test_plugin_*.py) run the same runtime inside vLLM.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_hust_vspec import methods
from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.startup_cost.forced import ForcedK
from vllm_hust_vspec.runtime.engine import EngineRuntime, KLookup, runtime_of

pytestmark = pytest.mark.unit


@dataclasses.dataclass
class Request:
    request_id: str
    num_tokens: int = 20
    num_computed_tokens: int = 19  # decoding: all but the last token computed
    num_output_placeholders: int = 0
    num_output_tokens: int = 0
    is_prefill_chunk: bool = False
    arrival_time: float = 0.0
    spec_token_ids: list[int] = dataclasses.field(default_factory=list)

    def is_finished(self) -> bool:
        return False


@dataclasses.dataclass
class DraftTokenIds:
    req_ids: list[str]
    draft_token_ids: list[list[int]]


def scheduler(method: str = "draft_model", kmax: int = 4, n: int = 2, async_: bool = False):
    reqs = [Request(f"r{i}") for i in range(n)]
    spec = SimpleNamespace(method=method, num_speculative_tokens_per_batch_size=[(1, 1, kmax)])
    return SimpleNamespace(
        vllm_config=SimpleNamespace(speculative_config=spec), num_spec_tokens=kmax,
        scheduler_config=SimpleNamespace(max_num_seqs=8, async_scheduling=async_),
        running=reqs, requests={r.request_id: r for r in reqs})


def runtime(sched, **values) -> EngineRuntime:
    rt = EngineRuntime(sched, settings_mod.Settings(values))
    seen = []
    observe = rt.controller.observe

    def spy(result):  # every StepResult the controller is given, in order
        seen.append(result)
        observe(result)

    rt.controller.observe = spy
    rt.seen = seen
    return rt


def step_output(sched, drafts: dict[str, int]):
    """A pure decode step's SchedulerOutput and ModelRunnerOutput: each running request
    scheduled with ``drafts[id]`` draft tokens."""
    ids = [r.request_id for r in sched.running]
    spec = {r: [0] * drafts.get(r, 0) for r in ids}
    out = SimpleNamespace(
        num_scheduled_tokens={r: 1 + len(spec[r]) for r in ids},
        scheduled_spec_decode_tokens={r: t for r, t in spec.items() if t},
        total_num_scheduled_tokens=sum(1 + len(t) for t in spec.values()),
        num_spec_tokens_to_schedule=max(drafts.values(), default=0),
        scheduled_new_reqs=[], scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()))
    mro = SimpleNamespace(sampled_token_ids=[[1] for _ in ids],
                          req_id_to_index={r: i for i, r in enumerate(ids)})
    return out, mro


def run_step(rt, sched, drafted: dict[str, int], accept: int = 1) -> int:
    """One engine step as the host calls the patches: the decision, the verification of the
    drafts made by the step before (``drafted``), the new drafts; returns the host's K."""
    k_host = KLookup(rt)[len(sched.running)]
    out, mro = step_output(sched, drafted)
    with rt.output_step(out, mro):
        for rid, d in drafted.items():
            rt.on_verified(rid, d, min(accept, d), None)
            sched.requests[rid].num_output_tokens += 1 + min(accept, d)
    new = DraftTokenIds([r.request_id for r in sched.running],
                        [[7] * k_host for _ in sched.running])
    kept = rt.trimmed(new)
    return k_host, {r: len(t) for r, t in zip(kept.req_ids, kept.draft_token_ids)}


def test_a_0_to_3_jump_prices_k0_with_the_methods_drafter_passes():
    """Step 4 verifies drafts of K = 0 and drafts K = 3: its result says so (two Ks), its
    drafter passes are those of K = 3, and the controller keeps the method's K = 0 passes (0
    for EAGLE under synchronous scheduling, patch eagle-k0) instead of learning 3 from the
    mix (the old bug)."""
    sched = scheduler(method="eagle", kmax=4)
    rt = runtime(sched, adaptive_policy="sweep", adaptive_sweep=[0, 0, 0, 3, 3, 3])
    drafted = dict.fromkeys(rt.scheduler.requests, 0)
    for _ in range(6):
        k, drafted = run_step(rt, sched, drafted)
    jump = rt.seen[3]
    assert (jump.step, jump.k_verified, jump.k_drafted) == (4, 0, 3)
    assert jump.num_draft_steps == methods.draft_forwards("eagle", 3) == 3
    assert rt.seen[4].k_verified == rt.seen[4].k_drafted == 3
    assert [r.k_verified for r in rt.seen] == [4, 0, 0, 0, 3, 3]  # the first drafts: Kmax
    assert rt.controller.cost.draft_min_steps == methods.draft_forwards("eagle", 0) == 0


def test_the_model_drafters_cost_nothing_at_k0_under_sync_scheduling():
    """drafter-k0, eagle-k0 and dflash-k0 skip the drafter's forward at K = 0 (synchronous
    scheduling only); a drafter without the skip (gemma4) still runs one."""
    for method in ("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark"):
        assert methods.draft_forwards(method, 0) == 0
        assert methods.draft_forwards(method, 0, skip_k0=False) == 1
    assert methods.draft_forwards("gemma4", 0) == 1
    assert methods.draft_forwards("draft_model", 2) == 2
    rt = runtime(scheduler(kmax=4), adaptive_policy="fixed", adaptive_fixed_gamma=2)
    assert rt.controller.cost.draft_min_steps == 0
    rt = runtime(scheduler(kmax=4, async_=True), adaptive_policy="fixed", adaptive_fixed_gamma=2)
    assert rt.controller.cost.draft_min_steps == 1


def test_decide_output_trim_with_a_fixed_k_method():
    """A proposer that asserts K == Kmax (suffix) drafts Kmax; the decided K cuts each
    request's drafts and the async placeholders."""
    sched = scheduler(method="suffix", kmax=4)
    rt = runtime(sched, adaptive_policy="fixed", adaptive_fixed_gamma=2)
    k_host, kept = run_step(rt, sched, dict.fromkeys(sched.requests, 0))
    assert k_host == 4
    assert kept == {"r0": 2, "r1": 2}
    assert rt.draft_limit("r0") == 2
    out, _ = step_output(sched, dict.fromkeys(sched.requests, 4))
    rt.cut_placeholders(out)
    assert [r.spec_token_ids for r in sched.running] == [[-1, -1], [-1, -1]]
    assert rt.seen[0].num_draft_steps == 0  # suffix runs no drafter model


def test_the_k_pipeline_under_async_scheduling():
    """Two decisions before the first output (async scheduling): each output pairs the K
    it verified with the K it drafted, in order."""
    sched = scheduler(kmax=4, async_=True)
    rt = runtime(sched, adaptive_policy="sweep", adaptive_sweep=[1, 3, 2])
    lookup = KLookup(rt)
    assert [lookup[2], lookup[2]] == [1, 3]
    for drafted in (4, 1):
        out, mro = step_output(sched, dict.fromkeys(sched.requests, drafted))
        with rt.output_step(out, mro):
            for rid in sched.requests:
                rt.on_verified(rid, drafted, 0, None)
    assert lookup[2] == 2
    out, mro = step_output(sched, dict.fromkeys(sched.requests, 3))
    with rt.output_step(out, mro):
        pass
    assert [(r.step, r.k_verified, r.k_drafted) for r in rt.seen] == [(1, 4, 1), (2, 1, 3),
                                                                      (3, 3, 2)]
    assert [int(r.drafted.sum()) for r in rt.seen[:2]] == [8, 2]
    assert rt.seen[2].drafted is None  # nothing verified in that step


def test_invalid_drafts_are_not_counted_as_verified():
    sched = scheduler(kmax=4, n=1)
    rt = runtime(sched, adaptive_policy="sweep", adaptive_sweep=[4])
    KLookup(rt)[1]
    out, mro = step_output(sched, {"r0": 4})
    with rt.output_step(out, mro):
        rt.on_verified("r0", 4, 1, {"r0": 2})
        rt.on_verified("r0", 0, 0, None)  # no drafts: not a verification
    assert rt.seen[0].drafted.tolist() == [2]


def test_a_forced_width_keeps_the_controller_out_and_hands_back_cleanly():
    sched = scheduler(kmax=4)
    rt = runtime(sched, adaptive_policy="fixed", adaptive_fixed_gamma=1)
    run_step(rt, sched, dict.fromkeys(sched.requests, 0))
    forced = ForcedK(3, rt.kmax, rt.varies_k)
    rt.override_k(forced)
    assert not rt.wants_draft_signals
    for _ in range(3):
        k_host, kept = run_step(rt, sched, dict.fromkeys(sched.requests, 3))
        assert k_host == 3 and kept == {"r0": 3, "r1": 3}
    assert len(rt.seen) == 1 and rt.controller.decisions == 1
    assert [(s.batch, s.rows, s.prefill) for s in forced.steps] == [(2, 8, False)] * 3
    rt.override_k(None)
    run_step(rt, sched, dict.fromkeys(sched.requests, 3))
    # the first result after the hand-back verified drafts made at the host's Kmax
    assert (rt.seen[1].k_verified, rt.seen[1].k_drafted) == (4, 1)
    assert rt.controller.decisions == 2


def test_listeners_see_where_each_request_accepted_drafts():
    sched = scheduler(kmax=2, n=1)
    rt = runtime(sched, adaptive_policy="sweep", adaptive_sweep=[2])
    events = []
    rt.outputs.listeners.append(lambda req, pos, acc: events.append((req.request_id, pos, acc)))
    drafted = {"r0": 0}
    for _ in range(3):
        _, drafted = run_step(rt, sched, drafted, accept=2)
    # output positions 0 (no drafts yet), 1 (accepted 2 -> tokens 1, 2, 3), 4
    assert events == [("r0", 0, 0), ("r0", 1, 2), ("r0", 4, 2)]


def test_runtime_of_finds_only_an_attached_runtime(monkeypatch):
    from vllm_hust_vspec.runtime.engine import attach

    sched = scheduler()
    monkeypatch.delenv(settings_mod.ENABLE_ENV, raising=False)
    assert attach(sched) is None and runtime_of(sched) is None
    monkeypatch.setenv(settings_mod.ENABLE_ENV, "1")
    rt = attach(sched)
    assert runtime_of(sched) is rt
    assert isinstance(sched.dynamic_sd_lookup, KLookup)


def test_a_prefill_joining_the_step_does_not_change_the_decision_batch():
    """The K lookup decides on the decode requests (the host keys its table on every
    scheduled request, so a prefill joining a step moved K there)."""
    sched = scheduler(kmax=4, n=2)
    newcomer = Request("new", num_tokens=30, num_computed_tokens=0)
    sched.running.append(newcomer)
    sched.requests["new"] = newcomer
    rt = runtime(sched, adaptive_policy="sweep", adaptive_sweep=[3])
    seen = []
    decide = rt.controller.decide
    rt.controller.decide = lambda view: seen.append(view.req_ids) or decide(view)
    KLookup(rt)[3]
    assert seen == [("r0", "r1")]
    for r in sched.running:  # every request prefills: the decision is made on all
        r.num_computed_tokens = 0
    KLookup(rt)[3]
    assert seen[-1] == ("r0", "r1", "new")


def test_the_ledger_counts_k0_skips_and_the_tokens_a_resume_catches_up(tmp_path):
    """The decision trace's drafter records (the workers' rule, kept by the engine): each
    K = 0 step is a skipped drafter forward; the first drafting step after a stretch of n
    steps catches each request up by n positions (one of them the next-token slot the step
    before the stretch already wrote: the account does not count that slot as valid)."""
    sched = scheduler(kmax=4, n=2)
    trace = tmp_path / "t.jsonl"
    rt = runtime(sched, adaptive_policy="schedule", adaptive_schedule="1-8:0")
    assert rt.ledger is not None
    rt.outputs.trace = None
    records = []
    rt.outputs.records = lambda recs: records.extend(recs)

    def step(k: int) -> None:
        rt.gate.controller.decide = lambda view: __import__(
            "vllm_hust_vspec.adaptive.observations", fromlist=["Decision"]).Decision(
                k=k, k_i=None, policy="t", reason="t", est_accept=(), est_cost_ms=None)
        KLookup(rt)[2]
        out, mro = step_output(sched, {})
        for r in sched.running:  # the scheduler advanced them in _update_after_schedule
            r.num_computed_tokens += 1
        with rt.output_step(out, mro):
            for r in sched.running:
                r.num_tokens += 1

    for k in (2, 0, 0, 0, 2, 2, 0, 2):
        step(k)
    drafter = [r["drafter"] for r in records if "drafter" in r]
    assert sum(d["skipped"] for d in drafter) == 4
    assert [d["caught_up"] for d in drafter if not d["skipped"]] == [6, 2]  # 2 x 3, 2 x 1
    assert rt.ledger.tokens_caught_up == 8 and rt.ledger.steps_skipped == 4
    del trace


def test_a_resume_that_caught_the_drafter_up_is_not_priced_as_its_k():
    """The first drafting step after K = 0 steps also runs the drafter's catch-up pass
    (drafter-k0): the controller gets its acceptance but not its time, so a resume does not
    make K > 0 look dearer than it is (which held the online policy at K = 0 on the real
    engine); the steps around it are timed."""
    sched = scheduler(kmax=4, n=2)
    rt = runtime(sched, adaptive_policy="sweep", adaptive_sweep=[2, 0, 0, 2, 2])
    assert rt.ledger is not None
    for _ in range(5):
        KLookup(rt)[2]
        out, mro = step_output(sched, {})
        for r in sched.running:
            r.num_computed_tokens += 1
        with rt.output_step(out, mro):
            for r in sched.running:
                r.num_tokens += 1
    assert [r.k_drafted for r in rt.seen] == [2, 0, 0, 2, 2]
    assert [r.wall_ms is None for r in rt.seen] == [False, False, False, True, False]


class Boom(RuntimeError):
    pass


def _raise_from(step: int, original):
    """``original`` that raises from the controller's step ``step`` on."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) >= step:
            raise Boom(f"injected at call {len(calls)}")
        return original(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("where", ["decide", "observe"])
def test_a_fault_in_the_controller_falls_back_to_k0_and_keeps_serving(where, caplog, tmp_path):
    """An exception in the policy's decide (or in the estimators' observe) at a chosen step:
    the runtime logs it once with the step and the traceback, decides K = 0 from then on
    without calling the controller again, traces those steps as 'fallback', counts the
    fault for the stats line and /metrics, and every later step still runs."""
    from vllm_hust_vspec.runtime.metrics_feed import MetricsFeed
    sched = scheduler(kmax=4)
    sched.log_stats = True
    trace = tmp_path / "decisions.jsonl"
    rt = runtime(sched, adaptive_policy="fixed", adaptive_fixed_gamma=3,
                 adaptive_trace_file=str(trace))
    assert isinstance(rt.outputs.metrics, MetricsFeed)
    if where == "decide":
        rt.controller.policy.decide = _raise_from(5, rt.controller.policy.decide)
    else:
        rt.controller.acceptance.update_counts = _raise_from(
            5, rt.controller.acceptance.update_counts)
    drafted = dict.fromkeys(rt.scheduler.requests, 0)
    ks = []
    with caplog.at_level("ERROR", logger="vllm_hust_vspec"):
        for _ in range(10):
            k, drafted = run_step(rt, sched, drafted)
            ks.append(k)
            rt.publish({0: SimpleNamespace(scheduler_stats=None)})
    # decide: the 5th decision raises, step 5 runs at K = 0; observe: the 5th verification
    # that reaches the acceptance estimate (step 7's: step 1 verified no drafts, step 2 the
    # requests' first drafts, kept out of it) raises, step 8 is the first at K = 0
    at, faulted = (5, 5) if where == "decide" else (7, 8)
    assert ks[:faulted - 1] == [3] * (faulted - 1) and ks[faulted - 1:] == [0] * (11 - faulted)
    assert rt.fault.tripped and rt.fault.step == at
    errors = [r for r in caplog.records if f"controller failed at step {at}" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info and errors[0].exc_info[0] is Boom
    import json
    recs = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
    fallback = [r for r in recs if r.get("policy") == "fallback"]
    assert [r["step"] for r in fallback] == list(range(faulted, 11))
    assert all(r["k"] == 0 and r["reason"].startswith("fallback k=0") for r in fallback)
    assert rt._stats()["fallbacks"] == 1 and rt._stats()["policy"] == "fallback(k=0)"


@pytest.mark.parametrize("where", ["take", "trim", "count"])
def test_a_fault_in_the_runtimes_own_bookkeeping_never_reaches_the_host(where, caplog):
    """The engine-core entry points the patches call (the step's results, the drafts' trim,
    a verification's count) fall back to the safe K when they raise, and return what the
    host needs (the drafts as drafted): an exception there stopped the engine core once (a
    paired comparison's stale confidences, below)."""
    sched = scheduler(kmax=4)
    rt = runtime(sched, adaptive_policy="fixed", adaptive_fixed_gamma=3)
    target = {"take": (rt._verified, "take"), "trim": (rt, "trim_drafts"),
              "count": (rt._verified, "add")}[where]
    setattr(*target, _raise_from(3, getattr(*target)))
    drafted = dict.fromkeys(rt.scheduler.requests, 0)
    ks = []
    with caplog.at_level("ERROR", logger="vllm_hust_vspec"):
        for _ in range(8):
            k, drafted = run_step(rt, sched, drafted)
            ks.append(k)
    assert rt.fault.tripped and ks[-1] == 0 and ks[0] == 3
    assert sum("controller failed" in r.getMessage() for r in caplog.records) == 1


def test_a_compared_policy_without_confidences_drops_the_kept_ones():
    """budget (reads confidences, here width 1) then online (none, drafts 3 wide): the
    budget window's kept confidences are dropped when the online window's drafts arrive, so
    their verification meets no stale row (it raised 'a request verified 2 drafts but only 1
    draft confidences were kept' in a real paired server)."""
    sched = scheduler(kmax=4)
    rt = runtime(sched, adaptive_policy="budget")
    ids = [r.request_id for r in sched.running]
    rt.trim_drafts(ids, [[7] for _ in ids], np.full((len(ids), 1), 0.9, np.float32))
    assert rt._verified._conf is not None
    rt._wants_conf = False  # an online window takes over
    rt.trim_drafts(ids, [[7, 7, 7] for _ in ids], None)
    assert rt._verified._conf is None
    for rid in ids:
        rt._verified.add(rid, 3, 1)
    assert rt._verified.take().confidences is None


def test_a_fault_reaches_metrics_once():
    from vllm_hust_vspec.runtime.metrics_feed import MetricsFeed
    sched = scheduler(kmax=4)
    sched.log_stats = True
    rt = runtime(sched, adaptive_policy="fixed", adaptive_fixed_gamma=2)
    rt.controller.policy.decide = _raise_from(3, rt.controller.policy.decide)
    drafted = dict.fromkeys(rt.scheduler.requests, 0)
    sent = []
    for _ in range(6):
        k, drafted = run_step(rt, sched, drafted)
        sent.append(rt.outputs.metrics.drain())
    assert isinstance(rt.outputs.metrics, MetricsFeed)
    assert sum(p["fallbacks"] for p in sent if p) == 1
    kinds = [sum(p["kinds"]["fallback"] for p in sent if p), sum(p["kinds"]["hold"] for p in sent if p)]
    assert kinds == [4, 2]


def test_a_fault_drill_trips_the_fallback_at_its_step():
    """adaptive_inject_fault = 3: the third decision raises inside the guard; from it on the
    engine runs at K = 0 and the stats line counts one fallback."""
    sched = scheduler(kmax=4)
    rt = runtime(sched, adaptive_policy="fixed", adaptive_fixed_gamma=2, adaptive_inject_fault=3)
    drafted = dict.fromkeys(rt.scheduler.requests, 0)
    ks = []
    for _ in range(5):
        k, drafted = run_step(rt, sched, drafted)
        ks.append(k)
    assert ks == [2, 2, 0, 0, 0]
    assert rt.fault.step == 3 and "adaptive_inject_fault" not in rt.fault.reason
    assert rt._stats()["fallbacks"] == 1


class _Config033:
    """Stands in for vLLM 0.33's ``VllmConfig``, which this host (0.32) lacks: only the V1
    gate's presence and ``use_v2_model_runner`` are read."""

    def _maybe_disable_dynamic_sd_for_v1(self) -> None:  # the host's gate (0.33+)
        raise AssertionError("never called by the plugin")

    def __init__(self, spec, v2: bool) -> None:
        self.speculative_config = spec
        self.use_v2_model_runner = v2


@pytest.mark.parametrize(("method", "v2", "varies"), [
    ("gemma4", False, False),  # 0.33 V1: dynamic SD off for it -> K stays Kmax
    ("gemma4", True, True),  # V2 truncates drafts centrally: K varies
    ("eagle", False, True),  # on the host's V1 list
    ("draft_model", False, True),
])
def test_the_hosts_v1_dynamic_sd_gate_is_respected(method, v2, varies, caplog):
    sched = scheduler(method)
    sched.vllm_config = _Config033(sched.vllm_config.speculative_config, v2)
    with caplog.at_level("WARNING", logger="vllm_hust_vspec"):
        rt = runtime(sched)
    assert rt.varies_k is varies
    if not varies:
        assert "vLLM turns per-step K off for method gemma4" in caplog.text
        assert {rt.decide() for _ in range(20)} == {4}  # Kmax on every step
    else:
        assert "turns per-step K off" not in caplog.text


@pytest.mark.parametrize("method", ["draft_model", "eagle"])
def test_on_v2_the_runtime_asks_no_confidences_and_says_what_is_v1_only(method, caplog):
    from vllm_hust_vspec.runtime.engine import v2_notes

    v1 = runtime(scheduler(method), adaptive_policy="budget")
    assert v1.wants_draft_signals and not v1.v2  # V1, synchronous: the budget reads them
    sched = scheduler(method)
    sched.vllm_config = _Config033(sched.vllm_config.speculative_config, True)
    rt = runtime(sched, adaptive_policy="budget")
    assert rt.v2 and not rt.wants_draft_signals
    with caplog.at_level("WARNING", logger="vllm_hust_vspec"):
        v2_notes(rt)
    assert "V1-only here: draft confidences" in caplog.text
    assert "policy budget reads draft confidences" in caplog.text
    assert ("drafts Kmax=4 tokens every step" in caplog.text) is (method == "draft_model")


def test_no_gate_on_this_host():
    assert not methods.host_fixes_k(SimpleNamespace(use_v2_model_runner=False), "gemma4")


def test_a_request_resumed_after_preemption_is_caught_up_from_0():
    """A request preempted after drafting to position 10 and recomputed while the drafter
    sits out (resumed_req_ids) is caught up from 0 at its next drafting step, even though
    its first position there (12) is past its old account (10): its blocks are new."""
    from vllm_hust_vspec.runtime.drafter_ledger import DrafterLedger

    def out(scheduled, resumed=()):
        return SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_new_reqs=[],
                               scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)))

    def req(n):
        return {"a": SimpleNamespace(num_computed_tokens=n, is_finished=lambda: False)}

    ledger = DrafterLedger()
    ledger.before(req(10), out({"a": 1}))
    ledger.after(1, 2, req(10))
    assert ledger.synced == {"a": 10}
    ledger.before(req(12), out({"a": 12}, resumed=["a"]))  # recomputed 0..11, K = 0
    assert ledger.after(2, 0, req(12))["drafter"] == {"skipped": 1, "caught_up": 0}
    ledger.before(req(14), out({"a": 2}))
    assert ledger.after(3, 2, req(14))["drafter"] == {"skipped": 0, "caught_up": 12}


def test_the_hust_attach_checks_the_config_and_leaves_no_lookup(monkeypatch):
    """vLLM-HUST 0.17 (patch ``hust-attach``): no dynamic-SD lookup to replace, and the
    refusals the front end makes on vLLM >= 0.24 (method, data parallelism) happen here; a
    Kmax-wide draft list is cut to the step's K (``hust-draft-trim``) and so are Kmax
    placeholders (``hust-async-placeholders``)."""
    from vllm_hust_vspec.runtime.engine import attach
    from vllm_hust_vspec.settings import SettingsError

    monkeypatch.setenv(settings_mod.ENABLE_ENV, "1")
    monkeypatch.setenv("HUST_VSPEC_ADAPTIVE_POLICY", "fixed")
    monkeypatch.setenv("HUST_VSPEC_ADAPTIVE_FIXED_GAMMA", "2")
    sched = scheduler(method="eagle", kmax=4)
    sched.vllm_config.parallel_config = SimpleNamespace(data_parallel_size=1)
    sched.vllm_config.speculative_config.num_speculative_tokens = 4
    rt = attach(sched, k_lookup=False)
    assert runtime_of(sched) is rt and not hasattr(sched, "dynamic_sd_lookup")
    assert rt.k_step == 4  # nothing decided yet: Kmax
    assert rt.decide() == 2 and rt.k_step == 2
    assert rt.pads_to_kmax
    kept = rt.trimmed(DraftTokenIds(["r0", "r1"], [[1, 2, 3, 4], [5, 6, 0, 0]]))
    assert kept.draft_token_ids == [[1, 2], [5, 6]]
    # async: the host set Kmax placeholders (and told the runtime no K of its own)
    out, _ = step_output(sched, {"r0": 4, "r1": 4})
    for r in sched.running:
        r.spec_token_ids = [-1] * 4
    out.num_spec_tokens_to_schedule = 4
    rt.cut_placeholders(out)
    assert [r.spec_token_ids for r in sched.running] == [[-1, -1], [-1, -1]]

    monkeypatch.setenv("HUST_VSPEC_ADAPTIVE_POLICY", "online")
    dp = scheduler(method="eagle", kmax=4)
    dp.vllm_config.parallel_config = SimpleNamespace(data_parallel_size=2)
    dp.vllm_config.speculative_config.num_speculative_tokens = 4
    with pytest.raises(SettingsError, match="data_parallel_size=2"):
        attach(dp, k_lookup=False)
    assert runtime_of(dp) is None
    custom = scheduler(method="custom_class", kmax=4)
    custom.vllm_config.parallel_config = SimpleNamespace(data_parallel_size=1)
    custom.vllm_config.speculative_config.num_speculative_tokens = 4
    with pytest.raises(SettingsError, match="custom_class"):
        attach(custom, k_lookup=False)


@pytest.mark.parametrize(("settings", "named"), [
    ({"HUST_VSPEC_ADAPTIVE_REFILL_BATCH": "4"}, "adaptive_refill_batch"),
    ({"HUST_VSPEC_ADAPTIVE_POLICY": "budget"}, "draft confidences"),
    ({"HUST_VSPEC_ADAPTIVE_STOP": "confidence"}, "draft confidences"),
    ({"HUST_VSPEC_CONFIDENCE_ACCEPT_MARGIN": "2.0"}, "lossy acceptance"),
])
def test_the_hust_attach_refuses_what_017_has_no_patch_for(monkeypatch, settings, named):
    from vllm_hust_vspec.runtime.engine import attach
    from vllm_hust_vspec.settings import SettingsError

    monkeypatch.setenv(settings_mod.ENABLE_ENV, "1")
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    sched = scheduler(method="eagle", kmax=4)
    sched.vllm_config.parallel_config = SimpleNamespace(data_parallel_size=1)
    sched.vllm_config.speculative_config.num_speculative_tokens = 4
    with pytest.raises(SettingsError, match=f"vLLM-HUST 0.17.*{named}"):
        attach(sched, k_lookup=False)
    assert runtime_of(sched) is None


def test_the_first_drafts_of_joining_requests_are_cut_where_they_rarely_pass():
    """A request that prefills in a step drafts its first drafts at the end of it: under an
    adaptive policy, once first drafts were seen to pass rarely, its limit is the depth
    ``Decision.k_first`` gives (0 here), the decoding requests keep the decision's K, and
    the trace says so; a fixed K drafts K for everyone (adaptive/first_drafts.py)."""
    def run(policy: str):
        sched = scheduler(kmax=4, n=2)
        newcomer = Request("new", num_tokens=30, num_computed_tokens=0)
        sched.running.append(newcomer)
        sched.requests["new"] = newcomer
        rt = runtime(sched, **policy)
        records = []
        rt.outputs.records = lambda recs: records.extend(recs)
        return rt, records

    rt, records = run({"adaptive_policy": "online", "adaptive_trace": True})
    KLookup(rt)[3]
    assert rt.draft_limit("new") is None  # no first draft verified yet
    first = rt.controller.first_drafts
    first.observe(np.full(16, 4), np.r_[np.ones(2, dtype=int), np.zeros(14, dtype=int)])
    ks = []
    while not ks or ks[-1] == 0:  # the warm-up's K = 0 step cuts nothing
        ks.append(KLookup(rt)[3])
        assert len(ks) < 8
    k = ks[-1]
    assert rt.draft_limit("new") == 0
    assert (rt.draft_limit("r0") or k) > 0  # the decoding requests draft
    rt._flush_records()
    decisions = [r for r in records if "policy" in r and "k" in r]
    assert decisions[-1]["joining"] == 1 and decisions[-1]["k_first"] == 0
    assert "k_first" not in decisions[0]
    rt, _ = run({"adaptive_policy": "fixed:3"})
    assert rt.controller.first_drafts is None
    KLookup(rt)[3]
    assert rt.draft_limit("new") is None
