"""Patch spec-metadata-no-drafts: a step without drafts gets the host's speculative metadata
without its index arithmetic, the same values and dtypes.

One real CPU engine (draft model, plugin on); the runner's patched
``_calc_spec_decode_metadata`` and the host's original (``__wrapped__``) are called on the
same runner with the same inputs: decode-only batches, batches with prompt chunks (several
tokens scheduled, no drafts) and, for the host path, batches with drafts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plugin_helpers import close, engine_spec, make_llm, plugin_env

pytestmark = [pytest.mark.host]

FIELDS = ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens",
          "target_logits_indices", "bonus_logits_indices", "logits_indices")


def _runner(llm):
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return executor.driver_worker.worker.model_runner


def _same(a, b) -> None:
    assert a.num_draft_tokens == b.num_draft_tokens
    assert a.max_spec_len == b.max_spec_len
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, (name, x.dtype, y.dtype)
        assert x.device == y.device, name
        assert torch.equal(x, y), (name, x, y)


def test_metadata_without_drafts_equals_the_hosts(fixtures_dir):
    model, spec = engine_spec(fixtures_dir, "draft_model", 3)
    with plugin_env(adaptive_policy="fixed", adaptive_fixed_gamma=0):
        llm = make_llm(model, spec)
        try:
            runner = _runner(llm)
            patched = runner._calc_spec_decode_metadata
            original = type(runner)._calc_spec_decode_metadata.__wrapped__
            assert patched.__func__ is not original  # the patch is installed
            rng = np.random.default_rng(0)
            cases = []
            for n in (1, 2, 8, 16):
                scheduled = np.ones(n, dtype=np.int32)  # decode only
                cases.append((np.zeros(n, dtype=np.int32), scheduled))
                mixed = scheduled.copy()
                mixed[rng.integers(0, n)] = int(rng.integers(2, 40))  # a prompt chunk joins
                cases.append((np.zeros(n, dtype=np.int32), mixed))
                drafts = rng.integers(0, 4, size=n).astype(np.int32)
                drafts[0] = 2  # the host's own path
                cases.append((drafts, drafts + 1))
            for drafts, scheduled in cases:
                # the host's cumsum (no dtype: int64 here) and an int32 one
                for cu in (np.cumsum(scheduled), np.cumsum(scheduled, dtype=np.int32)):
                    ours = patched(drafts.copy(), cu.copy())
                    host = original(runner, drafts.copy(), cu.copy())
                    _same(ours, host)
        finally:
            close(llm)
