"""``vllm-hust-vspec-fit-profile SAMPLES.json PROFILE.json`` as a subprocess."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from vllm_hust_vspec.adaptive.profile import load_profile

pytestmark = pytest.mark.cli

FIT = str(pathlib.Path(sys.executable).parent / "vllm-hust-vspec-fit-profile")
SIM = str(pathlib.Path(sys.executable).parent / "vllm-hust-vspec-sim")
DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


def fit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FIT, *args], capture_output=True, text=True, timeout=120, check=False)


def _samples(**extra):
    doc = {"max_speculative_tokens": 8, "initial_gamma": 2, "batch_gamma_policy": {"8": 4, "64": 1},
           "target_samples": [], "draft_samples": []}
    for ctx in (512, 2048, 8192):
        for tokens in (4, 16, 64, 256):
            doc["target_samples"].append({"context_tokens": ctx, "batched_tokens": tokens,
                                          "latency_ms": 0.002 * ctx + 0.05 * tokens + 8.0})
            doc["draft_samples"].append({"context_tokens": ctx, "batched_tokens": tokens,
                                         "latency_ms": 0.0001 * ctx + 0.01 * tokens + 0.7})
    doc.update(extra)
    return doc


def test_fit_writes_loadable_profile(tmp_path):
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps(_samples()))
    out_path = tmp_path / "profile.json"
    out = fit(str(samples), str(out_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"wrote {out_path}")
    assert "target: latency_ms = 0.002 * context_tokens + 0.05 * batched_tokens + 8" in out.stdout
    assert "(12 samples" in out.stdout
    prof = load_profile(out_path)
    assert (prof.target.alpha, prof.target.gamma, prof.target.delta_ms) == pytest.approx((0.002, 0.05, 8.0))
    assert (prof.draft.alpha, prof.draft.gamma, prof.draft.delta_ms) == pytest.approx((0.0001, 0.01, 0.7))
    assert prof.batch_gamma_policy == {8: 4, 64: 1} and prof.initial_gamma == 2
    # the fitted profile drives the profile policy in the simulator
    run = subprocess.run([SIM, str(DATA / "ramp.jsonl"), "--policy", f"profile:{out_path}", "--json"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["policies"][f"profile:{out_path}"]["tok_s"] > 0


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(target_samples=d["target_samples"][:2]), "'target_samples' has 2 sample(s); at least 3"),
        (lambda d: [s.update(batched_tokens=16) for s in d["draft_samples"]], "'draft_samples' is rank-deficient"),
        (lambda d: d["draft_samples"][5].update(latency_ms=-0.1), "draft_samples[5].latency_ms must be >= 0"),
        (lambda d: d.update(target_samples={}), "must be a list of samples"),
        (lambda d: d.update(batch_gamma_policy={"8": 12}), "batch_gamma_policy.8"),
    ],
)
def test_bad_samples_one_error_exit_2(tmp_path, mutate, needle):
    doc = _samples()
    mutate(doc)
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps(doc))
    out_path = tmp_path / "profile.json"
    out = fit(str(samples), str(out_path))
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-hust-vspec-fit-profile: error: ")
    assert needle in err[0] and str(samples) in err[0], err[0]
    assert not out_path.exists()


def test_unreadable_and_invalid_json(tmp_path):
    out = fit(str(tmp_path / "none.json"), str(tmp_path / "p.json"))
    assert out.returncode == 2 and "cannot read" in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    out = fit(str(bad), str(tmp_path / "p.json"))
    assert out.returncode == 2 and "invalid JSON at line 1" in out.stderr


def test_missing_argument_exit_2():
    out = fit("only-one.json")
    assert out.returncode == 2 and "PROFILE.json" in out.stderr
