"""The Grafana dashboard (dashboards/vllm-hust-vspec.json) and docs/metrics.md against the one
list of metrics (runtime/metric_names.py), and vLLM's metric names against the installed
host's source (read as text: this test imports nothing of vLLM)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest

from vllm_hust_vspec.runtime.metric_names import METRICS, PREFIX

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "vllm-hust-vspec.json"
OURS = re.compile(re.escape(PREFIX) + r"[a-z0-9_]+")
VLLMS = re.compile(r"vllm:[a-z0-9_]+")


def _exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        out += [t["expr"] for t in panel["targets"]]
    out.append(doc["templating"]["list"][1]["definition"])
    return out


def _series(metric) -> set[str]:
    if metric.kind == "histogram":
        return {metric.full_name + s for s in ("_bucket", "_sum", "_count")}
    return {metric.exposed}


def test_the_dashboard_plots_every_metric_and_only_ours():
    known = set().union(*(_series(m) for m in METRICS))
    used = {name for e in _exprs() for name in OURS.findall(e)}
    assert used <= known, used - known
    for metric in METRICS:
        assert _series(metric) & used, f"{metric.full_name} is on no panel"


def test_the_vllm_metrics_it_plots_exist_in_the_installed_host():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed")
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    source = "".join(p.read_text() for p in [root / "v1" / "metrics" / "loggers.py",
                                            root / "v1" / "spec_decode" / "metrics.py"])
    declared = set(re.findall(r'"(vllm:[a-z0-9_]+)"', source))
    used = {name for e in _exprs() for name in VLLMS.findall(e)}
    assert used, "the dashboard shows nothing of vLLM's own"
    for name in used:  # counters are exposed with _total
        assert name in declared or name.removesuffix("_total") in declared, name


def test_docs_list_every_metric():
    text = (REPO / "docs" / "metrics.md").read_text()
    listed = set(OURS.findall(text))
    for metric in METRICS:
        assert metric.exposed in listed, metric.exposed
    known = set().union(*(_series(m) for m in METRICS)) | {m.full_name for m in METRICS}
    assert listed <= known, listed - known
