"""The front end's part of the plugin (runtime/frontend.py) on stand-in configs.

The host's ``VllmConfig`` needs a model to build; these stand-ins carry only the attributes
the functions read.  The real front end runs them in tests/host (``dynamic-sd-config``) and
tests/cli (the launcher's capture sizes use the same ``capture.capture_sizes``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_hust_vspec import settings as settings_mod
from vllm_hust_vspec.capture import capture_sizes
from vllm_hust_vspec.runtime.frontend import configure_speculative, widen_capture_sizes

pytestmark = pytest.mark.unit


def _config(sizes, kmax=3, max_cap=None):
    return SimpleNamespace(
        speculative_config=None if kmax is None else SimpleNamespace(num_speculative_tokens=kmax),
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=sizes,
                                           max_cudagraph_capture_size=max_cap),
        scheduler_config=SimpleNamespace(max_num_seqs=8))


def test_every_verify_width_gets_a_capture_size_under_the_hosts_cap(monkeypatch):
    monkeypatch.delenv("HUST_VSPEC_ADAPTIVE_MIN_GAMMA", raising=False)
    cfg = _config([1, 2, 4, 8, 16])
    widen_capture_sizes(cfg)
    want = sorted({1, 2, 4, 8, 16} | set(capture_sizes(8, 3, max_num_batched_tokens=16)))
    assert cfg.compilation_config.cudagraph_capture_sizes == want
    assert {2 * (k + 1) for k in range(1, 4)} <= set(want)  # n = 2, every K
    assert max(want) == 16


@pytest.mark.parametrize("sizes, kmax", [([], 3), ([1, 2], None), ([1, 2], 0)])
def test_no_graphs_or_no_speculation_leaves_the_sizes(sizes, kmax):
    cfg = _config(list(sizes), kmax=kmax)
    widen_capture_sizes(cfg)
    assert cfg.compilation_config.cudagraph_capture_sizes == list(sizes)


def test_the_config_is_untouched_while_the_plugin_is_off(monkeypatch):
    monkeypatch.delenv(settings_mod.ENABLE_ENV, raising=False)
    spec = SimpleNamespace(num_speculative_tokens_per_batch_size=None, num_speculative_tokens=3)
    assert configure_speculative(spec, SimpleNamespace(data_parallel_size=1)) is spec
    assert spec.num_speculative_tokens_per_batch_size is None
    assert configure_speculative(None, None) is None


@pytest.mark.parametrize("kmin, kmax, seqs", [(0, 4, 16), (2, 6, 16), (0, 4, 5), (1, 8, 256)])
def test_the_covering_table_names_every_k_in_the_hosts_own_expansion(kmin, kmax, seqs):
    """vLLM's V2 runner captures the widths K + 1 of the dense table it expands (the host's
    own build_dynamic_sd_schedule_lookup, the same function in 0.32 and 0.33)."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    from vllm_hust_vspec.capture import covering_table

    table, left_out = covering_table(kmin, kmax, seqs)
    dense = build_dynamic_sd_schedule_lookup(table, vllm_max_batch_size=seqs,
                                             vllm_num_speculative_tokens=kmax)
    assert set(dense[1:]) == set(range(kmin, kmax + 1)) and left_out == ()


def test_too_few_batch_sizes_leave_out_the_smallest_k_never_kmax():
    from vllm_hust_vspec.capture import covering_table

    assert covering_table(0, 4, 3) == ([(1, 1, 2), (2, 2, 3), (3, 3, 4)], (0, 1))
    assert covering_table(0, 4, 1) == ([(1, 1, 4)], (0, 1, 2, 3))


def _v2_config(v2, table, kmax=4, seqs=16):
    return SimpleNamespace(
        use_v2_model_runner=v2,
        speculative_config=SimpleNamespace(num_speculative_tokens=kmax,
                                           num_speculative_tokens_per_batch_size=table),
        scheduler_config=SimpleNamespace(max_num_seqs=seqs))


def test_on_v2_the_plugins_own_table_becomes_the_covering_one(monkeypatch):
    from vllm_hust_vspec.runtime.frontend import cover_v2_widths

    monkeypatch.setenv("HUST_VSPEC_ADAPTIVE_MIN_GAMMA", "1")
    cfg = _v2_config(True, [(1, 1, 4)])
    cover_v2_widths(cfg)
    assert cfg.speculative_config.num_speculative_tokens_per_batch_size == [
        (1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 16, 4)]
    v1 = _v2_config(False, [(1, 1, 4)])  # V1 captures by the capture sizes: untouched
    cover_v2_widths(v1)
    assert v1.speculative_config.num_speculative_tokens_per_batch_size == [(1, 1, 4)]
    user = _v2_config(True, [(1, 4, 4), (5, 16, 2)])  # the user's own table: as given
    cover_v2_widths(user)
    assert user.speculative_config.num_speculative_tokens_per_batch_size == [(1, 4, 4), (5, 16, 2)]
