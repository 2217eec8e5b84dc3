"""Cost models (SPS, additive), NNLS, and the CostTable JSON round trip / refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_hust_vspec.adaptive.costmodel import (
    AdditiveModel,
    CostTable,
    CostTableError,
    SpsModel,
    nnls,
)

pytestmark = pytest.mark.unit

META = dict(
    model_id="org/target+org/draft",
    dtype="bfloat16",
    quantization=None,
    parallel={"tensor_parallel_size": 1, "data_parallel_size": 1},
    execution={"graph": "full", "async_scheduling": True},
    host_version="0.32.0",
)


def _additive_samples(noise=0.0, seed=0):
    """Truth: bias 2 ms, alpha = {1: 0, 4: 1 ms, 8: 3 ms}, theta = {8: 0, 16: 2 ms, 32: 5 ms}."""
    rng = np.random.default_rng(seed)
    alpha = {1: 0.0, 4: 0.001, 8: 0.003}
    theta = {8: 0.0, 16: 0.002, 32: 0.005}
    out = []
    for b in alpha:
        for g in theta:
            if g >= b:
                for _ in range(3):
                    out.append((b, g, (0.002 + alpha[b] + theta[g]) * (1 + noise * rng.standard_normal())))
    return out


def test_nnls_matches_unconstrained_when_positive():
    rng = np.random.default_rng(1)
    a = rng.random((20, 3))
    x_true = np.array([1.0, 2.0, 3.0])
    x = nnls(a, a @ x_true)
    assert np.allclose(x, x_true, atol=1e-9)


def test_nnls_clips_negative_coefficient():
    # b = 1 - 2*x1 over x1 in 0..4: the best non-negative fit of [x1, 1] drops x1
    x1 = np.arange(5.0)
    a = np.stack([x1, np.ones(5)], axis=1)
    x = nnls(a, 10.0 - 2.0 * x1)
    assert x[0] == 0.0
    assert x[1] == pytest.approx(6.0)  # mean of b
    assert (x >= 0).all()


def test_additive_fit_recovers_truth():
    model = AdditiveModel.fit(_additive_samples())
    assert model.bias_s == pytest.approx(0.002, abs=1e-9)
    assert model.alpha_s == pytest.approx({1: 0.0, 4: 0.001, 8: 0.003}, abs=1e-9)
    assert model.theta_s == pytest.approx({8: 0.0, 16: 0.002, 32: 0.005}, abs=1e-9)
    # padded up to buckets: B=3 -> 4, G=20 -> 32
    assert model.step_ms(3, 20) == pytest.approx(1000 * (0.002 + 0.001 + 0.005))
    assert not model.covers(9, 16) and not model.covers(4, 33)
    with pytest.raises(ValueError, match="outside the calibrated buckets"):
        model.step_ms(9, 16)
    assert list(model.step_ms_many(3, np.array([8, 9, 33]))) == pytest.approx([3.0, 5.0, np.inf])


def test_additive_fit_refuses_disconnected_grid():
    # request bucket 1 only measured at G=8, bucket 4 only at G=16: alpha and theta mix
    with pytest.raises(ValueError, match="not connected"):
        AdditiveModel.fit([(1, 8, 0.01), (1, 8, 0.011), (4, 16, 0.02), (4, 16, 0.021)])


def test_sps_fit_and_cost():
    model = SpsModel.fit([(1, 8, 0.010), (2, 8, 0.012), (4, 16, 0.020)])
    assert model.sps == pytest.approx({8: 1 / 0.011, 16: 50.0})
    assert model.step_ms(1, 5) == pytest.approx(11.0)
    assert model.step_ms(8, 16) == pytest.approx(20.0)
    assert not model.covers(1, 17)


@pytest.mark.parametrize("kind", ["additive", "sps"])
def test_table_round_trip(tmp_path, kind):
    table = CostTable.fit(kind, _additive_samples(noise=0.01), draft_width=5, **META)
    path = tmp_path / "costs.json"
    table.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "vspec-cost-table" and doc["version"] == 1
    assert doc["cost_model"] == kind and doc["draft_width"] == 5
    assert doc["buckets"]["target_rows"] == [8, 16, 32]
    loaded = CostTable.load(path)
    assert loaded.to_dict() == table.to_dict()
    for b, g in [(1, 8), (4, 16), (8, 32)]:
        assert loaded.step_ms(b, g) == pytest.approx(table.step_ms(b, g))
    loaded.check_compatible({"draft_width": 5, **META})


def test_table_without_draft_width_reads_as_7(tmp_path):
    doc = CostTable.fit("sps", _additive_samples(), draft_width=7, **META).to_dict()
    for key in ("format", "version", "draft_width"):
        doc.pop(key)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    table = CostTable.load(path)
    assert table.draft_width == 7
    with pytest.raises(CostTableError, match="field 'draft_width'"):
        table.check_compatible({"draft_width": 5})


@pytest.mark.parametrize(
    ("running", "field"),
    [
        ({"draft_width": 7}, "draft_width"),
        ({"model_id": "other/model"}, "model_id"),
        ({"dtype": "float16"}, "dtype"),
        ({"quantization": "fp8"}, "quantization"),
        ({"parallel": {"tensor_parallel_size": 2}}, "parallel.tensor_parallel_size"),
        ({"parallel": {"pipeline_parallel_size": 1}}, "parallel.pipeline_parallel_size"),
        ({"execution": {"async_scheduling": False}}, "execution.async_scheduling"),
        ({"host_version": "0.33.1"}, "host_version"),
    ],
)
def test_incompatible_table_names_the_field(tmp_path, running, field):
    path = tmp_path / "t.json"
    CostTable.fit("additive", _additive_samples(), draft_width=5, **META).save(path)
    table = CostTable.load(path)
    with pytest.raises(CostTableError) as err:
        table.check_compatible(running)
    assert err.value.field == field
    assert f"field '{field}'" in str(err.value) and str(path) in str(err.value)


def test_compatible_patch_release():
    table = CostTable.fit("additive", _additive_samples(), draft_width=5, **META)
    table.check_compatible({"host_version": "0.32.1", "parallel": {"tensor_parallel_size": 1}})


def _good_doc():
    return CostTable.fit("additive", _additive_samples(), draft_width=5, **META).to_dict()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(cost_model="linear"), "cost_model"),
        (lambda d: d.update(draft_width=0), "draft_width"),
        (lambda d: d.update(format="xllm"), "format"),
        (lambda d: d.update(version=9), "version"),
        (lambda d: d.pop("model_id"), "model_id"),
        (lambda d: d.update(parallel=[1]), "parallel"),
        (lambda d: d["additive"].update(bias_s=-0.001), "additive.bias_s"),
        (lambda d: d["additive"]["theta_s"].update({"64": "fast"}), "additive.theta_s.64"),
        (lambda d: d["additive"]["alpha_s"].update({"x": 0.1}), "additive.alpha_s.x"),
        (lambda d: d["buckets"].update(target_rows=[8, 16]), "additive.theta_s"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d.update(sps={"8": 10.0}), "sps"),
    ],
)
def test_malformed_table_names_the_field(tmp_path, mutate, field):
    doc = _good_doc()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CostTableError) as err:
        CostTable.load(path)
    assert err.value.field == field, str(err.value)


def test_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(CostTableError, match="cannot read"):
        CostTable.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CostTableError, match="invalid JSON"):
        CostTable.load(bad)


def test_sps_table_zero_rate_refused(tmp_path):
    doc = CostTable.fit("sps", _additive_samples(), draft_width=5, **META).to_dict()
    doc["sps"]["8"] = 0
    path = tmp_path / "z.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CostTableError, match="field 'sps.8'"):
        CostTable.load(path)
