"""The start-up calibration options through the real launcher: ``--dry-run`` checks the
calibration file's format, fields, ranges and width (= --gamma), the cost table's format,
fields and width, and the output path, before anything runs; one error naming the file and
the field, exit 2. Good files pass and travel to the engine as HUST_VSPEC_*."""

from __future__ import annotations

import json

import pytest
from launcher_util import dry_json
from test_launcher_errors import BASE, fails

from vllm_hust_vspec.adaptive.costmodel import CostTable

pytestmark = pytest.mark.cli

GOOD = {
    "cost_model": "additive",
    "request_buckets": [1, 2, 4],
    "contexts": [{"prefill_tokens": 200, "min_kv_length": 1, "max_kv_length": 1024}],
    "warmup_steps": 2,
    "window_steps": 8,
    "windows_per_point": 3,
    "token_seed": 7,
}
META = dict(model_id="t+d", dtype="float32", quantization=None, parallel={}, execution={},
            host_version="0.32.0")


def write(tmp_path, doc, name="calib.json") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def table(tmp_path, width: int, name="costs.json") -> str:
    samples = [(b, g, 0.001 * (1 + b / 8 + g / 16)) for b in (1, 2)
               for g in (b, 2 * b, (width + 1) * b) for _ in range(2)]
    path = tmp_path / name
    CostTable.fit("additive", samples, draft_width=width, **META).save(path)
    return str(path)


def test_good_calibration_file_passes_and_travels(tmp_path):
    path = write(tmp_path, GOOD)
    out = str(tmp_path / "costs.json")
    plan = dry_json(*BASE, "--gamma", "3", "--adaptive-dspark-calibration", path,
                    "--adaptive-dspark-cost-table-output", out)
    env = plan["env"]
    assert env["HUST_VSPEC_ADAPTIVE_DSPARK_CALIBRATION"] == path
    assert env["HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE_OUTPUT"] == out
    assert env["HUST_VSPEC_ADAPTIVE_POLICY"] == "budget"  # implied by the calibration file
    assert "HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE" not in env


def test_budget_policy_alone_checks_the_defaults():
    plan = dry_json(*BASE, "--adaptive-policy", "budget", "--max-model-len", "2048")
    assert plan["env"]["HUST_VSPEC_ADAPTIVE_POLICY"] == "budget"
    # the default steps (8 + 3 x 32 + 2 in flight) x width 5 do not fit in 400 tokens
    fails(*BASE, "--adaptive-policy", "budget", "--max-model-len", "400", "--dry-run",
          expect=("calibration defaults: contexts:", "530 tokens", "--adaptive-dspark-calibration"))


def test_good_cost_table_passes(tmp_path):
    path = table(tmp_path, 4)
    plan = dry_json(*BASE, "--adaptive-dspark-cost-table", path)
    assert plan["env"]["HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE"] == path
    assert plan["env"]["HUST_VSPEC_ADAPTIVE_POLICY"] == "budget"


@pytest.mark.parametrize("doc, field, text", [
    ("{", "<json>", "invalid JSON"),
    (dict(GOOD, contexts=[{"prefill_tokens": 600, "min_kv_length": 512, "max_kv_length": 2048},
                          {"prefill_tokens": 100, "min_kv_length": 1, "max_kv_length": 600}]),
     "contexts[1]", "overlaps contexts[0] (kv 1..600 vs 512..2048)"),
    (dict(GOOD, window_steps=0), "window_steps", "must be >= 1"),
    (dict(GOOD, request_buckets=[1, 3], draft_width=1), "draft_width",
     "1 differs from the running width 4"),
    (dict(GOOD, target_graph_rows=[1, 2, 3, 5, 7, 10, 20]), "target_graph_rows[4]",
     "G=7 is not B x (w + 1)"),
    (dict(GOOD, warmup_stepz=2), "warmup_stepz", "unknown key"),
])
def test_bad_calibration_file(tmp_path, doc, field, text):
    path = write(tmp_path, doc)
    fails(*BASE, "--adaptive-dspark-calibration", path, "--dry-run",
          expect=(f"error: {path}: {field}: ", text))


def test_width_mismatch_follows_gamma(tmp_path):
    path = write(tmp_path, dict(GOOD, draft_width=4))
    dry_json(*BASE, "--gamma", "4", "--adaptive-dspark-calibration", path)
    fails(*BASE, "--gamma", "5", "--adaptive-dspark-calibration", path, "--dry-run",
          expect=(f"{path}: draft_width: 4 differs from the running width 5", "--gamma"))


def test_disconnected_grid(tmp_path):
    path = write(tmp_path, dict(GOOD, request_buckets=[1, 3]))
    fails(*BASE, "--gamma", "1", "--adaptive-dspark-calibration", path, "--dry-run",
          expect=(f"{path}: target_graph_rows: ", "not connected through a shared G"))


def test_context_beyond_max_model_len_and_buckets_beyond_max_num_seqs(tmp_path):
    path = write(tmp_path, GOOD)
    fails(*BASE, "--adaptive-dspark-calibration", path, "--max-model-len", "800", "--dry-run",
          expect=(f"{path}: contexts[0].max_kv_length: 1024 exceeds max_model_len=800",))
    fails(*BASE, "--adaptive-dspark-calibration", path, "--max-num-seqs", "2", "--dry-run",
          expect=(f"{path}: request_buckets[2]: B=4 exceeds max_num_seqs=2",))


def test_bad_cost_table(tmp_path):
    good = table(tmp_path, 4)
    doc = json.loads(open(good).read())
    doc["additive"]["theta_s"]["oops"] = 1.0
    bad = write(tmp_path, doc, "bad-table.json")
    fails(*BASE, "--adaptive-dspark-cost-table", bad, "--dry-run",
          expect=(f"cost table {bad}: field 'additive.theta_s.oops'",))
    fails(*BASE, "--adaptive-dspark-cost-table", good, "--gamma", "6", "--dry-run",
          expect=(f"cost table {good}: field 'draft_width': table has 4", "running width is 6"))
    fails(*BASE, "--adaptive-dspark-cost-table", str(tmp_path / "none.json"), "--dry-run",
          expect=("none.json: field '<file>': cannot read",))


def test_a_draft5_table_is_refused_for_a_draft7_dspark_launch(tmp_path):
    """The seed's compatibility rule: a cost table calibrated on DSpark's block 5 cannot
    price block 7 (the ``dspark`` preset, --gamma 7), and the reverse; each width takes its own."""
    dspark = ("--config", "configs/dspark.toml", "--target-model", "/m/t", "--draft-model", "/m/d",
              "--target-platform", "cpu")
    draft5, draft7 = table(tmp_path, 5, "draft5.json"), table(tmp_path, 7, "draft7.json")
    fails(*dspark, "--adaptive-dspark-cost-table", draft5, "--dry-run",
          expect=(f"cost table {draft5}: field 'draft_width': table has 5",
                  "running width is 7"))
    fails(*dspark, "--gamma", "5", "--adaptive-dspark-cost-table", draft7, "--dry-run",
          expect=(f"cost table {draft7}: field 'draft_width': table has 7",
                  "running width is 5"))
    for width, path in ((7, draft7), (5, draft5)):
        plan = dry_json(*dspark, "--gamma", str(width), "--adaptive-dspark-cost-table", path)
        assert plan["env"]["HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE"] == path


def test_existing_or_homeless_output(tmp_path):
    existing = write(tmp_path, "{}", "old.json")
    fails(*BASE, "--adaptive-dspark-cost-table-output", existing, "--dry-run",
          expect=(f"--adaptive-dspark-cost-table-output: {existing} already exists",))
    homeless = str(tmp_path / "no-dir" / "t.json")
    fails(*BASE, "--adaptive-dspark-cost-table-output", homeless, "--dry-run",
          expect=("--adaptive-dspark-cost-table-output: directory", "does not exist"))


def test_conflicts(tmp_path):
    path = write(tmp_path, GOOD)
    fails(*BASE, "--adaptive-policy", "online", "--adaptive-dspark-calibration", path,
          "--dry-run", expect=("conflicting options: --adaptive-dspark-calibration and "
                               "--adaptive-policy", "budget policy only, not 'online'"))
    fails(*BASE, "--adaptive-policy", "fixed", "--adaptive-dspark-cost-table-output",
          str(tmp_path / "o.json"), "--dry-run",
          expect=("--adaptive-dspark-cost-table-output and --adaptive-policy",))
    fails(*BASE, "--adaptive-dspark-cost-table", table(tmp_path, 4),
          "--adaptive-dspark-calibration", path, "--dry-run",
          expect=("--adaptive-dspark-cost-table and --adaptive-dspark-calibration",
                  "skips the start-up calibration"))
    fails(*BASE, "--no-adaptive-speculation", "--adaptive-dspark-calibration", path,
          "--dry-run", expect=("the controller is off",))


def test_toml_keys_are_checked_too(tmp_path):
    path = write(tmp_path, dict(GOOD, token_seed=-1))
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[serve]\nadaptive_dspark_calibration = "{path}"\n')
    fails("--config", str(cfg), *BASE, "--dry-run",
          expect=(f"{path}: token_seed: must be >= 0",))
