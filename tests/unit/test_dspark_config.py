"""DSpark's hand-off to vLLM's V1 runner (runtime/dspark.py, front end) on stand-in configs.

The host's ``SpeculativeConfig`` needs a model to build; these stand-ins carry only the
attributes :func:`run_on_v1` reads and writes.  The real hand-off runs in
tests/host/test_dspark.py (a served DSpark draft on the CPU host)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_hust_vspec.runtime import dspark
from vllm_hust_vspec.settings import SettingsError

pytestmark = pytest.mark.unit


def _spec(**hf):
    base = {"architectures": ["Qwen3DSparkModel"], "sample_from_anchor": True, "markov_rank": 32,
            "target_layer_ids": [0, 1, 2], "mask_token_id": 0}
    base.update(hf)
    archs = base.pop("architectures")
    return SimpleNamespace(method="dspark", dspark_draft_topk=None, draft_sample_method="greedy",
                           draft_model_config=SimpleNamespace(model="/m/dspark", architectures=archs,
                                                              hf_config=SimpleNamespace(**base)))


def test_a_deepspec_draft_runs_as_the_v1_dflash_proposer_with_its_layers_and_mask():
    spec = _spec()
    dspark.run_on_v1(spec)
    hf = spec.draft_model_config.hf_config
    assert spec.method == "dflash"
    assert hf.dflash_config == {"target_layer_ids": [0, 1, 2], "mask_token_id": 0, "use_aux_hidden_state": True}
    assert hf.hust_dspark is True


def test_dflash_config_entries_win_and_are_kept():
    spec = _spec(dflash_config={"target_layer_ids": [1, 3], "mask_token_id": 7, "causal": False},
                 dspark_target_layer_ids=[0])
    dspark.run_on_v1(spec)
    assert spec.draft_model_config.hf_config.dflash_config == {
        "target_layer_ids": [1, 3], "mask_token_id": 7, "causal": False, "use_aux_hidden_state": True}


@pytest.mark.parametrize("change, words", [
    ({"architectures": ["DSparkDraftModel"]}, "Qwen3 DSpark drafts"),
    ({"sample_from_anchor": False}, "sample_from_anchor=false"),
    ({"dspark_draft_topk": 8}, "dspark_draft_topk"),
    ({"markov_rank": 0}, "no markov_rank"),
    ({"target_layer_ids": None}, "names no target layers"),
    ({"mask_token_id": None}, "no mask_token_id"),
])
def test_what_the_v1_proposer_cannot_draft_is_refused_by_name(change, words):
    spec = _spec(**change)
    with pytest.raises(SettingsError, match="--method dspark") as err:
        dspark.run_on_v1(spec)
    assert words in str(err.value)
    assert spec.method == "dspark"  # nothing changed


def test_a_sampled_draft_is_refused():
    spec = _spec()
    spec.draft_sample_method = "probabilistic"
    with pytest.raises(SettingsError, match="greedy"):
        dspark.run_on_v1(spec)


@pytest.mark.parametrize("forced, triton, oot, v1", [
    (None, False, False, True), (None, True, False, False), (False, True, False, True),
    (True, False, False, False), (None, False, True, False)])
def test_the_runner_is_decided_as_the_host_decides(forced, triton, oot, v1):
    assert dspark.v1_runner(SimpleNamespace(VLLM_USE_V2_MODEL_RUNNER=forced), triton, oot) is v1


def test_the_cpu_host_drafts_dspark_with_its_v1_runner():
    assert dspark.v1_runner()


def test_slot_temperatures_default_to_one_past_the_listed_slots():
    model = SimpleNamespace(config=SimpleNamespace(hust_confidence_temperatures=[0.5, 2.0]))
    assert dspark.temperatures(model, 4) == [0.5, 2.0, 1.0, 1.0]
    assert dspark.temperatures(SimpleNamespace(config=SimpleNamespace()), 2) == [1.0, 1.0]
