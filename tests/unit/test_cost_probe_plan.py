"""The start-up cost probe's pure side (startup_cost/probe.py): when it runs, its grid, its
samples. The engine side is tests/host/test_cost_probe.py."""

from __future__ import annotations

from vllm_hust_vspec.startup_cost import probe


def test_the_probe_is_off_when_asked_or_when_no_policy_prices_with_step_costs():
    """Pure Python: which runtimes probe (the option, the policies' ``uses_step_costs``)."""

    class _C:
        def __init__(self, uses: bool) -> None:
            self.uses_step_costs = uses

    class _S:
        def __init__(self, on: bool) -> None:
            self.adaptive_cost_probe = on

    class _R:
        def __init__(self, on: bool, *uses: bool) -> None:
            self.settings = _S(on)
            self.controllers = [_C(u) for u in uses]

    assert probe.wants_probe(_R(True, False, True))
    assert not probe.wants_probe(_R(False, True))
    assert not probe.wants_probe(_R(True, False, False))


def test_probe_grid_fits_a_short_context_and_a_small_batch_limit():
    grid = probe.probe_grid(4, 2, 64)
    assert grid.request_buckets == (1, 2)
    assert [(b, g // b - 1) for b, g, _ in grid.points()] == [
        (b, k) for b in (1, 2) for k in range(5)]
    ctx = grid.contexts[0]
    assert 1 <= ctx.prefill_tokens < ctx.max_kv_length <= 63  # inside max_model_len
    big = probe.probe_grid(8, 256, 4096)
    assert big.request_buckets == (1, 4, 16) and len(big.points()) == 27
    ctx = big.contexts[0]
    assert ctx.prefill_tokens == probe.PROBE_PREFILL
    # one prefill a point: the requests' KV growth over the point fits the context
    assert big.kv_needed(ctx) <= ctx.max_kv_length


def test_samples_count_the_drafter_passes_of_the_host():
    from vllm_hust_vspec.startup_cost.fit import Window

    windows = [Window(0, 4, 4, 0, 0, 0.010), Window(1, 4, 12, 2, 0, 0.020)]
    # the draft model sits out K = 0 (drafter-k0): no pass; K = 2 drafts in 2 passes
    assert probe.samples(windows, "draft_model", 4, True, True) == [
        (4, 4, 0, 10.0), (4, 12, 2, 20.0)]
    # a host that fixes K drafts Kmax and cuts per request
    assert probe.samples(windows, "draft_model", 4, False, True)[1][2] == 4
    # n-gram drafts without a forward
    assert probe.samples(windows, "ngram", 4, True, True)[1][2] == 0
