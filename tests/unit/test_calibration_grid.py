"""The start-up calibration grid: defaults, the file format, every refusal (one
CalibrationError naming the file and the field), the engine-limit and cost-table checks,
and the settings -> plan helper."""

from __future__ import annotations

import json

import pytest

from vllm_hust_vspec import settings
from vllm_hust_vspec.adaptive.costmodel import CostTable
from vllm_hust_vspec.startup_cost import (
    CalibrationError,
    CalibrationGrid,
    ContextRange,
    calibration_settings,
    check_cost_table,
    check_engine_limits,
    check_output_path,
    load_grid,
)
from vllm_hust_vspec.capture import capture_sizes

pytestmark = pytest.mark.unit

SEED_EXAMPLE = {  # the seed's custom configuration (note: "model", the seed's spelling)
    "model": "additive",
    "request_buckets": [1, 2, 4, 8, 16],
    "contexts": [{"prefill_tokens": 1868, "min_kv_length": 1800, "max_kv_length": 4096}],
    "warmup_steps": 8,
    "window_steps": 32,
    "windows_per_point": 3,
    "token_seed": 1,
}
META = dict(model_id="t+d", dtype="float32", quantization=None,
            parallel={"tensor_parallel_size": 1}, execution={"graph": "none"},
            host_version="0.32.0")


def write(tmp_path, doc, name="calib.json") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def refused(path: str, field: str, *more: str, **kw) -> str:
    kw.setdefault("draft_width", 4)
    with pytest.raises(CalibrationError) as info:
        load_grid(path, **kw)
    msg = str(info.value)
    assert msg.startswith(f"{path}: {field}: "), msg
    for m in more:
        assert m in msg, msg
    return msg


# ----------------------------------------------------------------------------- defaults


def test_cpu_defaults():
    g = load_grid(None, draft_width=4)
    assert g.source == "defaults" and g.cost_model == "additive"
    assert g.request_buckets == (1, 2, 4, 8, 16)
    assert g.target_graph_rows == tuple(sorted({b * (w + 1) for b in (1, 2, 4, 8, 16)
                                                for w in range(5)}))
    assert g.contexts == (ContextRange(256, 1, 4096),)
    assert (g.warmup_steps, g.window_steps, g.windows_per_point, g.token_seed) == (8, 32, 3, 1)
    assert g.time_cap_s == 600.0
    assert g.widths_for(2) == [0, 1, 2, 3, 4]
    pts = g.points()
    assert len(pts) == 25
    assert pts[0] == (1, 1, g.contexts[0]) and pts[-1] == (16, 80, g.contexts[0])
    assert all(gg == b * (w + 1) for (b, gg, _), w in zip(pts, [w for _ in range(5)
                                                              for w in range(5)]))
    assert g.steps_per_point == 8 + 3 * 32
    assert g.progress_tokens == (104 + 2) * 5
    assert g.kv_needed(g.contexts[0]) == 256 + 530


def test_defaults_fit_the_model_length_and_max_num_seqs():
    g = load_grid(None, draft_width=2, max_model_len=512, max_num_seqs=8)
    assert g.request_buckets == (1, 2, 4, 8)
    # prefill shortened to leave room for (8 + 96 + 2) steps x 3 tokens
    assert g.contexts == (ContextRange(512 - 318, 1, 512),)
    assert max(g.target_graph_rows) == 24


def test_defaults_that_cannot_fit_are_refused():
    with pytest.raises(CalibrationError) as info:
        load_grid(None, draft_width=4, max_model_len=400)
    msg = str(info.value)
    assert msg.startswith("calibration defaults: contexts: ")
    assert "530 tokens" in msg and "--adaptive-dspark-calibration" in msg


def test_defaults_from_captured_graph_buckets():
    sizes = capture_sizes(64, 4)
    g = load_grid(None, draft_width=4, graph_buckets=sizes, max_num_seqs=32)
    assert g.source == "defaults (captured graph buckets)"
    assert g.request_buckets == (1, 2, 4, 8, 16, 24, 32)
    assert set(g.target_graph_rows) <= set(sizes)
    assert all(b * 5 in g.target_graph_rows for b in g.request_buckets)
    assert g.contexts == (ContextRange(2048, 1, 4096),)
    # width 1: 24 = 8 x 3 is out of reach, so B=24 cannot join B=1's component; named
    g1 = load_grid(None, draft_width=1, graph_buckets=capture_sizes(32, 1), max_num_seqs=32)
    assert g1.request_buckets == (1, 2, 4, 8, 16, 32)
    assert g1.notes and "24" in g1.notes[0] and "24" in g1.describe()
    with pytest.raises(CalibrationError, match="calibration defaults: request_buckets: no captured"):
        load_grid(None, draft_width=4, graph_buckets=[1, 2, 3])


def test_describe_is_one_line_with_source_buckets_contexts_steps(tmp_path):
    g = load_grid(None, draft_width=4)
    line = g.describe()
    assert "\n" not in line
    for part in ("DSpark adaptive effective configuration", "source: defaults",
                 "B=[1, 2, 4, 8, 16]", "G=[1, 2, 3", "prefill 256, kv 1..4096",
                 "warmup_steps=8", "window_steps=32", "windows_per_point=3", "token_seed=1",
                 "points=25"):
        assert part in line, line
    path = write(tmp_path, SEED_EXAMPLE)
    assert f"source: {path}" in load_grid(path, draft_width=5).describe()


def test_to_dict_round_trips(tmp_path):
    g = load_grid(None, draft_width=3, max_model_len=2048)
    path = write(tmp_path, g.to_dict())
    back = load_grid(path, draft_width=3)
    assert back.to_dict() == g.to_dict()
    assert back.source == path


# ----------------------------------------------------------------------------- files


def test_seed_example_loads_with_defaults_filled_in(tmp_path):
    g = load_grid(write(tmp_path, SEED_EXAMPLE), draft_width=5, max_model_len=4096)
    assert g.cost_model == "additive" and g.draft_width == 5
    assert g.contexts == (ContextRange(1868, 1800, 4096),)
    assert g.target_graph_rows == tuple(sorted({b * (w + 1) for b in (1, 2, 4, 8, 16)
                                                for w in range(6)}))
    assert g.time_cap_s == 600.0 and len(g.points()) == 30


def test_partial_file_and_subset_rows(tmp_path):
    doc = {"cost_model": "sps", "draft_width": 4, "request_buckets": [2, 4],
           "target_graph_rows": [4, 10, 20], "time_cap_s": 90,
           "contexts": [{"prefill_tokens": 100, "min_kv_length": 1, "max_kv_length": 700},
                        {"prefill_tokens": 1000, "min_kv_length": 701, "max_kv_length": 2000}]}
    g = load_grid(write(tmp_path, doc), draft_width=4)
    assert g.widths_for(2) == [1, 4] and g.widths_for(4) == [0, 4]
    assert [(b, gg) for b, gg, _ in g.points()] == [(2, 4), (2, 10), (4, 4), (4, 20)] * 2
    assert g.time_cap_s == 90.0 and g.warmup_steps == 8


@pytest.mark.parametrize("doc, field, text", [
    ("{not json", "<json>", "invalid JSON at line 1"),
    ([1, 2], "<root>", "must be a JSON object"),
    ({"cost_modle": "sps"}, "cost_modle", "unknown key"),
    ({"model": "sps", "cost_model": "sps"}, "model", "not both"),
    ({"cost_model": "roofline"}, "cost_model", "'roofline'"),
    ({"draft_width": 7}, "draft_width", "7 differs from the running width 4"),
    ({"draft_width": "4"}, "draft_width", "must be an integer"),
    ({"warmup_steps": -1}, "warmup_steps", "must be >= 0"),
    ({"window_steps": 0}, "window_steps", "must be >= 1"),
    ({"windows_per_point": True}, "windows_per_point", "must be an integer"),
    ({"token_seed": 1.5}, "token_seed", "must be an integer"),
    ({"time_cap_s": 0}, "time_cap_s", "> 0"),
    ({"request_buckets": []}, "request_buckets", "non-empty list"),
    ({"request_buckets": [1, "2"]}, "request_buckets[1]", "must be an integer"),
    ({"request_buckets": [0, 1]}, "request_buckets[0]", "cannot run"),
    ({"request_buckets": [2, 1]}, "request_buckets[1]", "strictly increasing"),
    ({"request_buckets": [2], "target_graph_rows": [1, 2, 10]}, "target_graph_rows[0]",
     "G=1 is smaller than every request bucket"),
    ({"request_buckets": [1, 2], "target_graph_rows": [1, 2, 5, 7, 10]},
     "target_graph_rows[3]", "G=7 is not B x (w + 1)"),
    ({"request_buckets": [1, 2], "target_graph_rows": [1, 2, 4, 5]}, "request_buckets[1]",
     "B=2 has no full-width target rows G=2 x 5 = 10"),
    ({"contexts": {"prefill_tokens": 1}}, "contexts", "non-empty list"),
    ({"contexts": [7]}, "contexts[0]", "must be an object"),
    ({"contexts": [{"prefill_tokens": 600, "min_kv_length": 1}]}, "contexts[0].max_kv_length",
     "missing"),
    ({"contexts": [{"prefill_tokens": 600, "min_kv_length": 1, "max_kv_length": 2000,
                    "kv": 3}]}, "contexts[0].kv", "unknown key"),
    ({"contexts": [{"prefill_tokens": 0, "min_kv_length": 1, "max_kv_length": 2000}]},
     "contexts[0].prefill_tokens", "must be >= 1"),
    ({"contexts": [{"prefill_tokens": 600, "min_kv_length": 900, "max_kv_length": 800}]},
     "contexts[0]", "min_kv_length 900 > max_kv_length 800"),
    ({"contexts": [{"prefill_tokens": 600, "min_kv_length": 700, "max_kv_length": 2000}]},
     "contexts[0].prefill_tokens", "below min_kv_length 700"),
    ({"contexts": [{"prefill_tokens": 1500, "min_kv_length": 1, "max_kv_length": 2000}]},
     "contexts[0].prefill_tokens", "1500 + worst-case progress 530"),
    ({"contexts": [{"prefill_tokens": 600, "min_kv_length": 512, "max_kv_length": 2048},
                   {"prefill_tokens": 100, "min_kv_length": 1, "max_kv_length": 700}]},
     "contexts[1]", "overlaps contexts[0] (kv 1..700 vs 512..2048)"),
    ({"draft_width": 1, "request_buckets": [1, 3]}, "draft_width", "1 differs"),
])
def test_file_refusals(tmp_path, doc, field, text):
    refused(write(tmp_path, doc), field, text)


def test_contexts_beyond_the_model_length(tmp_path):
    doc = {"contexts": [{"prefill_tokens": 600, "min_kv_length": 1, "max_kv_length": 4096}]}
    refused(write(tmp_path, doc), "contexts[0].max_kv_length", "4096 exceeds max_model_len=2048",
            max_model_len=2048)


def test_buckets_beyond_max_num_seqs(tmp_path):
    refused(write(tmp_path, {"request_buckets": [1, 32]}), "request_buckets[1]",
            "B=32 exceeds max_num_seqs=16", max_num_seqs=16)


def test_unconnected_additive_grid_is_refused_sps_is_not(tmp_path):
    doc = {"draft_width": 1, "request_buckets": [1, 3]}  # G 1,2 and 3,6 share nothing
    msg = refused(write(tmp_path, doc), "target_graph_rows", "not connected through a shared G",
                  "B 1 (G 1,2) | B 3 (G 3,6)", draft_width=1)
    assert "'sps'" in msg
    g = load_grid(write(tmp_path, dict(doc, cost_model="sps"), "sps.json"), draft_width=1)
    assert [(b, gg) for b, gg, _ in g.points()] == [(1, 1), (1, 2), (3, 3), (3, 6)]
    # connected once a G is shared: B=2 joins them (2 = 1 x 2 and 6 = 2 x 3 is out of
    # reach at width 1, so 2 links only to B=1; B=3 stays apart)
    refused(write(tmp_path, dict(doc, request_buckets=[1, 2, 3]), "c.json"), "target_graph_rows",
            "B 1,2 (G 1,2,4) | B 3 (G 3,6)", draft_width=1)
    assert load_grid(write(tmp_path, dict(doc, draft_width=2, request_buckets=[1, 3]), "d.json"),
                     draft_width=2).request_buckets == (1, 3)  # G=3 = 1 x 3 = 3 x 1


def test_missing_file(tmp_path):
    refused(str(tmp_path / "nope.json"), "<file>", "cannot read")


def test_error_is_a_settings_error():
    assert issubclass(CalibrationError, settings.SettingsError)
    err = CalibrationError("a.json", "contexts[0]", "bad")
    assert str(err) == "a.json: contexts[0]: bad" and err.field == "contexts[0]"
    assert str(CalibrationError("whole message")) == "whole message"


# ----------------------------------------------------------------------------- engine limits


def _limits(**kw):
    base = dict(source="calib.json", max_num_seqs=16, max_num_batched_tokens=2048,
                max_model_len=4096, kv_capacity_tokens=100_000)
    base.update(kw)
    return base


def test_engine_limits_pass_and_refuse():
    g = load_grid(None, draft_width=4)
    check_engine_limits(g, **_limits())
    cases = [
        (dict(max_num_seqs=8), "calib.json: request_buckets[4]: B=16 exceeds the engine's max_num_seqs=8"),
        (dict(max_num_batched_tokens=64), "calib.json: target_graph_rows[16]: G=80 exceeds"),
        (dict(max_model_len=2048), "calib.json: contexts[0].max_kv_length: 4096 exceeds the engine's max_model_len=2048"),
        # 16 x (256 + 530) = 12576 tokens; with 16-token blocks 16 x 800 = 12800
        (dict(kv_capacity_tokens=12575), "16 requests x 786 KV tokens"),
        (dict(kv_capacity_tokens=12799, block_size=16), "= 12800 exceed the KV cache capacity of 12799"),
        (dict(graph_buckets=[1, 2, 4, 8]), "request_buckets[4]: B=16 is not a captured graph size"),
    ]
    for kw, text in cases:
        with pytest.raises(CalibrationError) as info:
            check_engine_limits(g, **_limits(**kw))
        assert text in str(info.value), str(info.value)
    check_engine_limits(g, **_limits(kv_capacity_tokens=12576))
    check_engine_limits(g, **_limits(kv_capacity_tokens=12800, block_size=16))


# ----------------------------------------------------------------------------- cost table


def _table(tmp_path, width=4, name="costs.json") -> str:
    samples = [(b, g, 0.001 * (1 + b / 8 + g / 16)) for b in (1, 2, 4)
               for g in (b, 2 * b, 5 * b) for _ in range(2)]
    path = tmp_path / name
    CostTable.fit("additive", samples, draft_width=width, **META).save(path)
    return str(path)


def test_cost_table_checks(tmp_path):
    path = _table(tmp_path)
    table = check_cost_table(path, draft_width=4, running={"dtype": "float32"})
    assert table.request_buckets == (1, 2, 4) and table.source == path
    with pytest.raises(CalibrationError) as info:
        check_cost_table(path, draft_width=7)
    assert str(info.value).startswith(f"cost table {path}: field 'draft_width': table has 4")
    with pytest.raises(CalibrationError, match=f"cost table {path}: field 'dtype'"):
        check_cost_table(path, draft_width=4, running={"dtype": "bfloat16"})
    doc = json.loads(open(path).read())
    del doc["host_version"]
    bad = write(tmp_path, doc, "bad.json")
    with pytest.raises(CalibrationError, match=f"cost table {bad}: field 'host_version': missing"):
        check_cost_table(bad, draft_width=4)
    with pytest.raises(CalibrationError, match="field '<json>'"):
        check_cost_table(write(tmp_path, "[", "broken.json"), draft_width=4)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CalibrationError, match="field '<file>': not UTF-8"):
        check_cost_table(str(binary), draft_width=4)
    refused(str(binary), "<file>", "not UTF-8")


# ----------------------------------------------------------------------------- plan


def _settings(**kw) -> settings.Settings:
    return settings.Settings(kw)


def test_plan_modes(tmp_path):
    assert calibration_settings(_settings(), draft_width=4).mode == "off"
    assert calibration_settings(_settings(adaptive_policy="budget", adaptive_speculation=False),
                                draft_width=4).mode == "off"
    plan = calibration_settings(_settings(adaptive_policy="budget"), draft_width=4,
                                max_model_len=2048)
    assert plan.mode == "calibrate" and plan.output is None and plan.grid is not None
    assert plan.grid.contexts[0].max_kv_length == 2048
    assert "kept in memory only" in plan.describe()
    out = str(tmp_path / "new.json")
    grid = write(tmp_path, SEED_EXAMPLE)
    plan = calibration_settings(_settings(adaptive_policy="budget",
                                          adaptive_dspark_calibration=grid,
                                          adaptive_dspark_cost_table_output=out), draft_width=5)
    assert plan.grid.source == grid and plan.output == out and f"saved to {out}" in plan.describe()
    table = _table(tmp_path)
    plan = calibration_settings(_settings(adaptive_policy="budget",
                                          adaptive_dspark_cost_table=table), draft_width=4)
    assert plan.mode == "load" and plan.table.source == table
    assert "calibration skipped" in plan.describe()


def test_plan_refusals(tmp_path):
    table = _table(tmp_path)
    existing = write(tmp_path, "{}", "exists.json")
    cases = [
        (dict(adaptive_dspark_calibration="c.json"), "read by the budget policy only"),
        (dict(adaptive_policy="budget", adaptive_dspark_cost_table=table,
              adaptive_dspark_cost_table_output=str(tmp_path / "o.json")),
         "a saved cost table skips the start-up calibration"),
        (dict(adaptive_policy="budget", adaptive_dspark_cost_table_output=existing),
         f"env HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE_OUTPUT: {existing} already exists"),
        (dict(adaptive_policy="budget", adaptive_dspark_cost_table=table + ".missing"),
         "field '<file>': cannot read"),
    ]
    for kw, text in cases:
        with pytest.raises(CalibrationError) as info:
            calibration_settings(_settings(**kw), draft_width=4)
        assert text in str(info.value), str(info.value)


def test_output_path_checks(tmp_path):
    check_output_path(str(tmp_path / "new.json"), "--out")
    with pytest.raises(CalibrationError, match="--out: .* already exists"):
        check_output_path(str(tmp_path), "--out")
    with pytest.raises(CalibrationError, match="directory .*nodir.* does not exist"):
        check_output_path(str(tmp_path / "nodir" / "t.json"), "--out")


def test_settings_validate_refuses_conflicts_from_env():
    env = {"HUST_VSPEC_ADAPTIVE_DSPARK_CALIBRATION": "c.json"}
    with pytest.raises(settings.SettingsError, match="read by the budget policy only.*'online'"):
        settings.from_env(env)
    env = {"HUST_VSPEC_ADAPTIVE_POLICY": "budget", "HUST_VSPEC_ADAPTIVE_DSPARK_CALIBRATION": "c.json",
           "HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE": "t.json"}
    with pytest.raises(settings.SettingsError, match="conflict: a saved cost table skips"):
        settings.from_env(env)
    ok = settings.from_env({"HUST_VSPEC_ADAPTIVE_POLICY": "budget",
                            "HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE": "t.json"})
    assert ok.adaptive_dspark_cost_table == "t.json"
    assert ok.to_env()["HUST_VSPEC_ADAPTIVE_DSPARK_COST_TABLE"] == "t.json"


def test_grid_is_frozen():
    g = CalibrationGrid("additive", 1, (1,), (1, 2), (ContextRange(10, 1, 500),))
    with pytest.raises(AttributeError):
        g.draft_width = 2  # type: ignore[misc]
    assert g.points() == [(1, 1, ContextRange(10, 1, 500)), (1, 2, ContextRange(10, 1, 500))]


def test_docs_example_is_valid(tmp_path):
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "calibration.md"
    example = re.search(r"```json\n(.*?)```", doc.read_text(), re.S).group(1)
    g = load_grid(write(tmp_path, example), draft_width=4, max_model_len=4096)
    assert len(g.contexts) == 2 and len(g.points()) == 50
    assert load_grid(None, draft_width=4).describe().split("(source: defaults)")[1] in doc.read_text()
