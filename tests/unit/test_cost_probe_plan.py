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
        def __init__(self, on: bool, *uses: bool, method: str = "draft_model") -> None:
            self.settings = _S(on)
            self.controllers = [_C(u) for u in uses]
            self.method = method

    assert probe.wants_probe(_R(True, False, True))
    assert probe.wants_probe(_R(True, True, method="mtp"))
    assert not probe.wants_probe(_R(False, True))
    assert not probe.wants_probe(_R(True, False, False))
    # an n-gram drafter drafts from the text: synthetic prompts hold no forced K
    assert not probe.wants_probe(_R(True, True, method="ngram"))


def test_the_probe_grid_is_cut_to_the_engines_kv_cache_and_step_budget():
    grid = probe.probe_grid(4, 16, 1024)  # 129 KV tokens a request: 160 in blocks of 32
    # the soak's KV cache: 36 blocks of 32 tokens hold 7 probe requests, not 16
    small = probe.fit_limits(grid, max_num_seqs=16, max_num_batched_tokens=2048,
                             kv_capacity_tokens=36 * 32, block_size=32)
    assert small.request_buckets == (1, 4, 7)
    assert [(b, g // b - 1) for b, g, _ in small.points()] == [
        (b, k) for b in (1, 4, 7) for k in range(5)]
    # a 48-token step budget: no point of more rows
    tight = probe.fit_limits(grid, max_num_seqs=16, max_num_batched_tokens=48,
                             kv_capacity_tokens=1 << 20, block_size=16)
    assert tight.request_buckets == (1, 4, 16)
    assert max(g for _, g, _ in tight.points()) <= 48
    assert (16, 48) in [(b, g) for b, g, _ in tight.points()]
    assert (16, 64) not in [(b, g) for b, g, _ in tight.points()]
    # not one request fits: no probe
    assert probe.fit_limits(grid, max_num_seqs=16, max_num_batched_tokens=2048,
                            kv_capacity_tokens=100, block_size=32) is None
    # what fits is left as it was
    assert probe.fit_limits(grid, max_num_seqs=16, max_num_batched_tokens=8192,
                            kv_capacity_tokens=1 << 20, block_size=16) == grid


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
