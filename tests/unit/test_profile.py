"""Latency profile format (schema 2 and legacy schema 1), NNLS fit, step cost."""

from __future__ import annotations

import json

import pytest

from vllm_hust_vspec.adaptive.profile import (
    LatencyModel,
    Profile,
    ProfileError,
    fit_profile,
    load_profile,
    profile_from_dict,
)

pytestmark = pytest.mark.unit


def _samples(target=(0.001, 0.02, 5.0), draft=(0.0002, 0.01, 1.0)):
    out = {"target_samples": [], "draft_samples": []}
    for ctx in (256, 1024, 4096):
        for tokens in (8, 32, 128):
            for key, (a, g, d) in (("target_samples", target), ("draft_samples", draft)):
                out[key].append({"context_tokens": ctx, "batched_tokens": tokens,
                                 "latency_ms": a * ctx + g * tokens + d})
    return out


def test_fit_recovers_coefficients():
    prof = fit_profile(_samples())
    assert (prof.target.alpha, prof.target.gamma, prof.target.delta_ms) == pytest.approx((0.001, 0.02, 5.0))
    assert (prof.draft.alpha, prof.draft.gamma, prof.draft.delta_ms) == pytest.approx((0.0002, 0.01, 1.0))
    assert prof.fit["target"]["samples"] == 9
    assert prof.fit["target"]["rmse_ms"] == pytest.approx(0.0, abs=1e-9)


def test_fit_is_non_negative():
    # latency falls with context: the unconstrained alpha would be negative
    doc = _samples()
    for s in doc["target_samples"]:
        s["latency_ms"] = 50.0 - 0.005 * s["context_tokens"] + 0.02 * s["batched_tokens"]
    prof = fit_profile(doc)
    assert prof.target.alpha == 0.0
    assert prof.target.gamma > 0 and prof.target.delta_ms > 0


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(target_samples=d["target_samples"][:2]), "has 2 sample"),
        (lambda d: [s.update(context_tokens=100) for s in d["draft_samples"]], "rank-deficient"),
        (lambda d: d["target_samples"][3].update(latency_ms=-1.0), r"target_samples\[3\].latency_ms must be >= 0"),
        (lambda d: d["target_samples"][0].update(latency_ms="x"), "must be a finite number"),
        (lambda d: d["target_samples"][0].pop("batched_tokens"), "exactly context_tokens"),
        (lambda d: d.pop("draft_samples"), "'draft_samples' is missing"),
        (lambda d: d.update(samples=[]), "unknown key 'samples'"),
        (lambda d: d.update(batch_gamma_policy={"8": 9}, max_speculative_tokens=4), "batch_gamma_policy.8"),
    ],
)
def test_fit_refuses_bad_samples(mutate, needle):
    doc = _samples()
    mutate(doc)
    with pytest.raises(ProfileError, match=needle):
        fit_profile(doc, source="s.json")


def test_round_trip_schema2(tmp_path):
    doc = _samples()
    doc.update(max_speculative_tokens=4, initial_gamma=3, batch_gamma_policy={"64": 4, "128": 2},
               per_gamma_overhead_ms={"2": 0.5})
    prof = fit_profile(doc)
    path = tmp_path / "p.json"
    prof.save(path)
    written = json.loads(path.read_text())
    assert written["format"] == "vspec-profile" and written["schema_version"] == 2
    assert set(written["target"]) == {"alpha", "gamma", "delta_ms"}
    back = load_profile(path)
    assert back == prof
    assert back.preferred_gamma(1) == 4 and back.preferred_gamma(100) == 2 and back.preferred_gamma(999) == 2


LEGACY = {
    "schema_version": 1,
    "max_speculative_tokens": 4,
    "initial_gamma": 4,
    "default_acceptance_rate": 0.75,
    "draft_parallel": False,
    "target": {"alpha_ms_per_context_token": 0.0, "gamma_ms_per_batched_token": 0.0, "delta_ms": 100.0},
    "draft": {"alpha_ms_per_context_token": 0.0, "gamma_ms_per_batched_token": 0.0, "delta_ms": 20.0},
    "per_gamma_overhead_ms": {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0},
    "batch_gamma_policy": {"64": 4, "128": 3},
}


def test_legacy_schema1_loads(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(LEGACY))
    prof = load_profile(path)
    assert prof.schema_version == 1
    assert prof.target == LatencyModel(0.0, 0.0, 100.0)
    assert prof.draft == LatencyModel(0.0, 0.0, 20.0)
    assert prof.preferred_gamma(32) == 4 and prof.preferred_gamma(100) == 3 and prof.preferred_gamma(500) == 3
    assert prof.max_speculative_tokens == 4 and prof.initial_gamma == 4
    # constant model: K serial draft forwards + one target forward
    assert prof.step_ms(8, 3) == pytest.approx(100.0 + 3 * 20.0)


def test_legacy_short_coefficient_names_load():
    doc = dict(LEGACY, target={"alpha": 0.001, "gamma": 0.01, "delta_ms": 3.0},
               draft={"alpha": 0, "gamma": 0, "delta_ms": 1.0})
    doc.pop("schema_version")  # no version: schema 1
    prof = profile_from_dict(doc)
    assert prof.target == LatencyModel(0.001, 0.01, 3.0)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(schema_version=3), "unsupported schema_version 3"),
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: d.pop("max_speculative_tokens"), "'max_speculative_tokens' is required"),
        (lambda d: d["target"].update(delta_ms=-1), r"'target.delta_ms' must be a finite number >= 0"),
        (lambda d: d.update(target={"alpha_ms_per_context_token": 0, "gamma_ms_per_batched_token": 0, "delta_ms": 0}),
         "positive forward latency"),
        (lambda d: d.update(batch_gamma_policy={"64": 5}), "batch_gamma_policy.64"),
        (lambda d: d.update(draft_parallel="yes"), "draft_parallel"),
    ],
)
def test_bad_profiles_refused(mutate, needle):
    doc = json.loads(json.dumps(LEGACY))
    mutate(doc)
    with pytest.raises(ProfileError, match=needle):
        profile_from_dict(doc, source="p.json")


def test_schema2_requires_format():
    doc = fit_profile(_samples()).to_dict()
    doc.pop("format")
    with pytest.raises(ProfileError, match="'format'"):
        profile_from_dict(doc)


def test_step_ms_serial_and_parallel():
    t = LatencyModel(0.001, 0.1, 5.0)
    d = LatencyModel(0.0005, 0.05, 1.0)
    serial = Profile(t, d)
    # B=4, K=2, ctx=1000: target 1 + 0.1*12 + 5 = 7.2; draft pass i: 0.0005*(1000 + 4i) + 0.05*4 + 1
    expect = 7.2 + (0.5 + 0.2 + 1.0) + (0.0005 * 1004 + 0.2 + 1.0)
    assert serial.step_ms(4, 2, 1000) == pytest.approx(expect)
    assert serial.step_ms(4, 0, 1000) == pytest.approx(1 + 0.4 + 5)
    assert serial.step_ms(4, 0, 1000, draft_steps=1) == pytest.approx(1 + 0.4 + 5 + 0.5 + 0.2 + 1.0)
    par = Profile(t, d, draft_parallel=True)
    assert par.step_ms(4, 2, 1000) == pytest.approx(7.2 + 0.5 + 0.05 * 12 + 1.0)
