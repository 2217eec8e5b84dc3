"""Dry-run goldens: every preset and protocol, for cpu and cuda (the cuda goldens pin the
capture sizes of each capture policy).  Regenerate with VSPEC_UPDATE_GOLDENS=1 after a
deliberate change, and review the diff."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from launcher_util import REPO, dry_json, normalized

from vllm_hust_vspec import settings

pytestmark = pytest.mark.cli

GOLDENS = pathlib.Path(__file__).parent / "goldens"
PRESETS = sorted(p.stem for p in (REPO / "configs").glob("*.toml"))
PLATFORMS = ("cpu", "cuda")

CASES: dict[str, list[str]] = {f"preset-{p}": ["--config", f"configs/{p}.toml"] for p in PRESETS}
CASES.update({
    "protocol-arc-easy-draft": ["--protocol", "arc-easy", "--method", "draft"],
    "protocol-arc-easy-eagle": ["--protocol", "arc-easy", "--method", "eagle"],
    "protocol-qwen35-frontier-mtp2": ["--protocol", "qwen35-frontier-mtp2"],
})
# vSpec 0.14's server and speculation flags (issue 19 item 6): vLLM arguments and
# speculative-config keys; explicit capture sizes on a graph mode.
CASES["vspec-server-flags"] = [
    "--config", "configs/tiny-cpu-draft.toml", "--kv-cache-dtype", "bfloat16", "--block-size",
    "32", "--language-model-only", "--disable-log-stats", "--eagle-disable-draft-torch-compile",
    "--draft-tensor-parallel-size", "1", "--graph-mode", "full-decode-only", "--capture-sizes",
    "1,2,4,8,16,32"]
CASES["vspec-mtp-local-argmax"] = ["--config", "configs/tiny-cpu-mtp.toml",
                                   "--mtp-local-argmax-reduction"]
CASES["vspec-draft-active-vocab"] = ["--config", "configs/tiny-cpu-draft.toml",
                                     "--draft-active-vocab-ids", "tests/cli/data/active-vocab.json",
                                     "--draft-active-vocab-size", "3",
                                     "--draft-lm-head-quantization", "w8a16"]
CASES["vspec-eagle-active-vocab"] = ["--config", "configs/tiny-cpu-eagle.toml",
                                     "--eagle-draft-active-vocab-ids",
                                     "tests/cli/data/active-vocab.json",
                                     "--eagle-draft-lm-head-quantization", "w8a16"]
CASES["vspec-refill-batch"] = ["--config", "configs/tiny-cpu-eagle.toml",
                               "--adaptive-refill-batch", "0",
                               "--adaptive-refill-max-wait-steps", "16"]
# Capture policies on a graph mode: sizes = request buckets x verify widths 1..5.
for policy in ("auto", "exact", "power2", "steady"):
    CASES[f"capture-{policy}"] = ["--config", "configs/tiny-cpu-draft.toml", "--graph-mode",
                                  "full-decode-only", "--max-num-seqs", "32",
                                  "--capture-policy", policy]


def test_every_preset_has_a_golden_case():
    assert len(PRESETS) == 16
    for name in ("draft", "draft-adaptive", "draft-arc-easy", "dspark", "eagle", "eagle-arc-easy",
                 "eagle-relaxed", "tiny-cpu-dspark",
                 "eagle3", "qwen35-eagle3", "qwen35-mtp2", "tiny-cpu-draft", "tiny-cpu-eagle",
                 "tiny-cpu-eagle3", "tiny-cpu-mtp", "tiny-cpu-ngram"):
        assert f"preset-{name}" in CASES


def without_schema_defaults(plan: dict) -> dict:
    """Goldens pin what the preset/protocol decides; plugin options left at their schema
    default are checked against the schema here instead (so tuning a controller default
    does not rewrite every golden)."""
    defaults = settings.Settings().to_env()
    env = plan["env"]
    if env.get("HUST_VSPEC_ENABLED") == "1":
        assert set(defaults) <= set(env), "every plugin option travels as HUST_VSPEC_<NAME>"
    out = dict(plan)
    out["env"] = {k: v for k, v in env.items() if defaults.get(k) != v}
    return out


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_golden(case: str, platform: str):
    plan = without_schema_defaults(normalized(dry_json(*CASES[case], "--target-platform",
                                                       platform)))
    golden = GOLDENS / f"{case}.{platform}.json"
    text = json.dumps(plan, indent=2, sort_keys=True) + "\n"
    assert "/root" not in text and "/home" not in text and str(REPO) not in text
    if os.environ.get("VSPEC_UPDATE_GOLDENS") == "1":
        golden.write_text(text)
    assert golden.is_file(), f"missing golden {golden.name}: run with VSPEC_UPDATE_GOLDENS=1"
    assert json.loads(golden.read_text()) == plan


def test_cuda_capture_goldens_pin_every_verify_width():
    """Every captured request bucket appears at every verify width 1..Kmax+1."""
    sizes = {}
    for policy in ("auto", "exact", "power2", "steady"):
        plan = json.loads((GOLDENS / f"capture-{policy}.cuda.json").read_text())
        cc = json.loads(plan["argv"][plan["argv"].index("--compilation-config") + 1])
        assert cc["cudagraph_mode"] == "FULL_DECODE_ONLY"
        sizes[policy] = cc["cudagraph_capture_sizes"]
    assert sizes["steady"] == [1, 2, 3, 4, 5, 32, 64, 96, 128, 160]
    assert sizes["power2"] == sorted({b * w for b in (1, 2, 4, 8, 16, 32) for w in range(1, 6)})
    assert sizes["auto"] == sorted({b * w for b in (1, 2, 4, 8, 16, 24, 32) for w in range(1, 6)})
    assert sizes["exact"] == sorted({b * w for b in list(range(1, 17)) + [24, 32]
                                     for w in range(1, 6)})
    cpu = json.loads((GOLDENS / "capture-exact.cpu.json").read_text())
    assert "cudagraph_capture_sizes" not in cpu["argv"][cpu["argv"].index("--compilation-config") + 1]
