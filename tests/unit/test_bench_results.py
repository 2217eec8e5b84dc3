"""The A/B benchmark's results: schema, medians and spread, ratio tables, the PNG."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vllm_hust_vspec.tools import bench_results as R
from vllm_hust_vspec.tools.bench_plot import plot_runs

pytestmark = pytest.mark.unit


def run(config: str, policy: str, k: int, workload: str, conc, rnd: int, tok_s: float,
        accept: float = 1.0, mean_k: float = 0.0) -> R.Run:
    return R.Run(config=config, policy=policy, k=k, workload=workload, concurrency=conc,
                 round=rnd, output_tok_s=tok_s, tpot_ms=1000.0 / tok_s,
                 mean_accept_len=accept, mean_k=mean_k)


def sample_runs() -> list[R.Run]:
    out = []
    # cell code@1: none 100/110/90; fixed-k1 150/160/140; fixed-k2 200/210/190; online 205/199/230
    for rnd, (n, f1, f2, on) in enumerate([(100, 150, 200, 205), (110, 160, 210, 199),
                                           (90, 140, 190, 230)], start=1):
        out += [run("none", "none", 0, "code", 1, rnd, n),
                run("fixed-k1", "fixed", 1, "code", 1, rnd, f1, 1.9, 1.0),
                run("fixed-k2", "fixed", 2, "code", 1, rnd, f2, 2.7, 2.0),
                run("online", "online", 2, "code", 1, rnd, on, 2.6, 1.8)]
        # swing cell: fixed-k1 is best there
        out += [run("none", "none", 0, "swing", "swing", rnd, 300),
                run("fixed-k1", "fixed", 1, "swing", "swing", rnd, 400),
                run("fixed-k2", "fixed", 2, "swing", "swing", rnd, 350),
                run("online", "online", 2, "swing", "swing", rnd, 480)]
    return out


def test_medians_spread_and_best_fixed_per_cell():
    cells = R.summarize(sample_runs(), ["code", "swing"])
    assert [(c.workload, c.concurrency) for c in cells] == [("code", 1), ("swing", "swing")]
    code, swing = cells
    assert code.configs["none"] == R.Stat(100.0, 90.0, 110.0, 3)
    assert code.configs["online"].median == 205.0
    assert code.best_fixed == "fixed-k2"
    assert swing.best_fixed == "fixed-k1"
    assert code.ratio("online", "none") == pytest.approx(2.05)
    assert code.ratio("online", code.best_fixed) == pytest.approx(205 / 200)
    assert swing.ratio("online", swing.best_fixed) == pytest.approx(1.2)
    assert code.accept["fixed-k2"] == 2.7 and code.mean_k["online"] == 1.8


def test_ratio_table_rows():
    runs = sample_runs()
    table = R.ratio_table(R.summarize(runs, ["code", "swing"]), R.config_order(runs))
    lines = table.splitlines()
    assert lines[0] == ("| workload | conc | best fixed | none | fixed-k1 | fixed-k2 | online "
                        "| judged |")
    assert lines[2] == ("| code | 1 | fixed-k2 | 1.00 / 0.50 | 1.50 / 0.75 | 2.00 / 1.00 "
                        "| 2.05 / 1.02 | no: none spread 20.0% |")
    assert lines[3].startswith("| swing | swing | fixed-k1 | 1.00 / 0.75 | 1.33 / 1.00 ")
    assert lines[3].endswith("| 1.60 / 1.20 | yes |")


def test_a_cell_judges_a_goal_only_with_three_rounds_quiet_servers_and_spreads_within_10pc():
    def cell(tok, loads=(0.9, 0.9, 0.9)):
        return {"none": [run("none", "none", 0, "code", 16, i + 1, 100.0) for i in range(3)],
                "online": [dataclasses.replace(run("online", "online", 4, "code", 16, i + 1, t),
                                               load_1m=ld)
                           for i, (t, ld) in enumerate(zip(tok, loads))]}
    assert R.verdict(cell((100.0, 105.0, 109.9))) == "yes"
    assert R.verdict(cell((100.0, 105.0, 111.0))) == "no: online spread 10.5%"
    assert R.verdict(cell((100.0, 101.0, 102.0), (0.9, 1.6, 1.0))) == (
        "no: online started at load 1.60")
    two = cell((100.0, 101.0, 102.0))
    two["online"] = two["online"][:2]
    assert R.verdict(two) == "no: online 2 round(s)"


def test_markdown_report_has_every_table():
    text = R.markdown_report(sample_runs(), ["code", "swing"])
    assert "over 3 round(s)" in text
    assert "| code | 1 | 100.0 (90.0-110.0) | 150.0 (140.0-160.0) |" in text
    assert "| code | 1 | 1.00 / 0.00 | 1.90 / 1.00 | 2.70 / 2.00 | 2.60 / 1.80 |" in text


def test_config_order_puts_none_first():
    runs = [run("online", "online", 4, "code", 1, 1, 10), run("none", "none", 0, "code", 1, 1, 9)]
    assert R.config_order(runs) == ["none", "online"]


def test_results_round_trip(tmp_path):
    path = tmp_path / "results.json"
    runs = sample_runs()
    R.write_results(path, "vllm-hust-vspec-bench ab", {"cpus": 2}, runs)
    doc = json.loads(path.read_text())
    assert set(doc) == {"command", "machine", "runs"}
    assert set(doc["runs"][0]) == set(R.RUN_KEYS)
    assert doc["runs"][4]["concurrency"] == "swing"
    doc2, runs2 = R.load_results(path)
    assert runs2 == runs and doc2["machine"] == {"cpus": 2}


GOOD = {"config": "fixed-k2", "policy": "fixed", "k": 2, "workload": "code", "concurrency": 4,
        "round": 1, "output_tok_s": 10.0, "tpot_ms": 5.0, "mean_accept_len": 2.0, "mean_k": 2.0}


@pytest.mark.parametrize("change, message", [
    ({"policy": "greedy"}, "key 'policy' must be one of"),
    ({"concurrency": 0}, "key 'concurrency'"),
    ({"concurrency": "burst"}, "key 'concurrency'"),
    ({"k": -1}, "key 'k'"),
    ({"policy": "none", "k": 3}, "must be 0 for policy none"),
    ({"output_tok_s": float("nan")}, "key 'output_tok_s'"),
    ({"mean_k": "2"}, "key 'mean_k'"),
    ({"extra": 1}, "unknown key 'extra'"),
])
def test_bad_run_rejected_naming_the_key(change, message):
    rec = {**GOOD, **change}
    with pytest.raises(R.ResultsError, match=message) as info:
        R.validate_results({"command": "c", "machine": {}, "runs": [GOOD, rec]}, "res.json")
    assert "res.json: runs[1]" in str(info.value)


def test_bad_document_rejected():
    with pytest.raises(R.ResultsError, match="key 'machine' is missing"):
        R.validate_results({"command": "c", "runs": []})
    rec = dict(GOOD)
    del rec["tpot_ms"]
    with pytest.raises(R.ResultsError, match="key 'tpot_ms' is missing"):
        R.validate_results({"command": "c", "machine": {}, "runs": [rec]})


def test_load_results_errors(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text("{nope")
    with pytest.raises(R.ResultsError, match="invalid JSON at line 1"):
        R.load_results(bad)
    with pytest.raises(R.ResultsError, match="cannot read"):
        R.load_results(tmp_path / "missing.json")


def test_png_is_written(tmp_path):
    path = plot_runs(sample_runs(), tmp_path / "ab.png", title="t", workload_order=["code", "swing"])
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_settle_steps_counts_decisions_until_k_stays_near_what_it_holds_later():
    from vllm_hust_vspec.tools.bench_driver import settle_steps

    def d(k, reason="best"):
        return {"step": 0, "k": k, "policy": "online", "reason": reason}

    recs = ([d(4, "warmup 1/6"), d(0, "warmup 2/6"), d(4), d(4), d(1), d(2), d(3, "probe k=3")]
            + [d(2)] * 10 + [d(0, "probe k=0")] + [d(3), d(2)] * 3)
    assert settle_steps(recs) == 4  # the K = 4 at index 3 is the last one off by more than 1
    assert settle_steps([d(2)] * 5) == 0
    assert settle_steps([dict(d(2), policy="fixed")] * 5) is None
    assert settle_steps([{"window": 1, "policy": "online", "k": 1}]) is None
    mixed = [d(2), dict(d(1), policy="fixed")]
    assert settle_steps(mixed) is None  # a paired run: several policies


def test_settle_steps_sets_each_decision_against_the_k_held_later_at_its_batch():
    """A concurrency-16 cell drains at its end: K rises with the falling batch there, which
    is the policy following the load, not a K still moving."""
    from vllm_hust_vspec.tools.bench_driver import settle_steps

    def d(k, batch, reason="best"):
        return {"step": 0, "k": k, "batch": batch, "policy": "online", "reason": reason}

    # filling: K = 3 at batch 12 is 2 off the K = 1 held at batch 8-15 later
    fill = [d(4, 1, "warmup 1/2"), d(3, 4), d(3, 12)]
    steady = [d(1, 16)] * 40
    drain = [d(1, 14), d(1, 10), d(2, 6), d(2, 5), d(3, 3), d(3, 2), d(4, 1), d(4, 1), d(3, 1)]
    assert settle_steps(fill + steady + drain) == 3  # settled at the first batch-16 decision
    # the same K = 4 at batch 16 late in the cell is off the K held there: not settled
    late = fill + steady + [d(4, 16)] + drain
    assert settle_steps(late) == len(fill) + len(steady) + 1
    # with one group for the whole cell the drain's K = 3-4 would be 2-3 off K = 1
    flat = [dict(r, batch=16) for r in fill + steady + drain]
    assert settle_steps(flat) == len(flat)  # the last decision (K = 3) is off: never settled
