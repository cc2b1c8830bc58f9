"""The Grafana dashboards: committed files equal the generator, and the JSON follows our rules.

Why both the generator and the files are checked: Grafana and the chart read only the files,
so the rules (datasource variable everywhere, unique ids, no overlapping panels, rates over
$__rate_interval, GPU-only series declared) are asserted on the parsed JSON; the generator
comparison makes sure nobody edited a file by hand.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.dashboards import DASHBOARDS, DEFAULT_VALUES, OUTPUT_DIR, panel_queries, render, stale
from tools.dashboards.__main__ import main

Obj = dict[str, Any]
FILES = sorted(DASHBOARDS)
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
LABEL_CLAUSES = re.compile(r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
METRIC = re.compile(r"\b(?:(?:finetune|DCGM|process)_\w+|up)\b")


def load(name: str) -> Obj:
    data: Obj = json.loads((OUTPUT_DIR / name).read_text(encoding="utf-8"))
    return data


def panels(dashboard: Obj) -> Iterator[Obj]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def targets(dashboard: Obj) -> Iterator[tuple[Obj, Obj]]:
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


def test_committed_dashboards_equal_the_generator_output() -> None:
    assert stale() == [], "run `python -m tools.dashboards` and commit the result"
    assert main(["--check"]) == 0


def test_generator_is_deterministic(tmp_path: Path) -> None:
    from tools.dashboards import write

    first = {p.name: p.read_text() for p in write(tmp_path)}
    assert first == {name: render(d) for name, d in DASHBOARDS.items()}


@pytest.mark.parametrize("name", FILES)
def test_classic_model_with_unique_ids_and_no_overlap(name: str) -> None:
    dashboard = load(name)
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels(dashboard):
        grid = p["gridPos"]
        x0, y0 = grid["x"], grid["y"]
        assert x0 >= 0 and x0 + grid["w"] <= 24, p["title"]
        area = {(x, y) for x in range(x0, x0 + grid["w"]) for y in range(y0, y0 + grid["h"])}
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area
        assert p["type"] in ("row", "timeseries", "stat")


@pytest.mark.parametrize("name", FILES)
def test_every_target_and_variable_uses_the_datasource_variable(name: str) -> None:
    dashboard = load(name)
    variables = dashboard["templating"]["list"]
    datasource = next(v for v in variables if v["name"] == "datasource")
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    for v in variables:
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE_REF, v["name"]
    count = 0
    for panel, target in targets(dashboard):
        assert panel["datasource"] == DATASOURCE_REF, panel["title"]
        assert target["datasource"] == DATASOURCE_REF, panel["title"]
        assert target["expr"].strip(), panel["title"]
        count += 1
    assert count >= 10


@pytest.mark.parametrize("name", FILES)
def test_ranges_use_grafana_intervals(name: str) -> None:
    for panel, target in targets(load(name)):
        for window in re.findall(r"\[([^\]]*)\]", target["expr"]):
            assert window in ("$__rate_interval", "$__range"), (panel["title"], window)
        if re.search(r"\b(rate|increase)\(", target["expr"]):
            assert "$__rate_interval" in target["expr"] or "$__range" in target["expr"], panel["title"]


def test_variables_of_the_training_dashboard() -> None:
    variables = {v["name"]: v for v in load("training-job.json")["templating"]["list"]}
    assert {"datasource", "namespace", "job", "rank"} <= set(variables)
    assert variables["rank"]["multi"] and variables["rank"]["allValue"] == ".*"
    for panel, target in targets(load("training-job.json")):
        expr = target["expr"]
        if "finetune_" in expr and "finetune_operator_" not in expr:
            assert 'finetune_job=~"$job"' in expr and 'namespace=~"$namespace"' in expr, panel["title"]


def test_rows_of_the_training_dashboard_follow_the_metrics_catalogue() -> None:
    dashboard = load("training-job.json")
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Progress", "GPU memory", "Communication", "GPU (dcgm-exporter)", "Pods"]
    titles = {p["title"] for p in panels(dashboard)}
    assert {
        "Step",
        "Progress",
        "ETA",
        "Tokens/s",
        "MFU",
        "Since last step",
        "Loss",
        "Learning rate",
        "Gradient norm",
        "Step time",
        "Headroom by rank",
        "Bus bandwidth by op",
        "Collective latency p99 by op",
        "Tensor core activity",
        "GPU utilisation",
        "PCIe receive",
    } <= titles


def test_the_progress_row_plots_the_preference_series() -> None:
    dashboard = load("training-job.json")
    panel = next(p for p in panels(dashboard) if p["title"] == "Preference (DPO / ORPO)")
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    progress, memory = (next(r for r in rows if r["title"] == t)["gridPos"]["y"] for t in ("Progress", "GPU memory"))
    assert progress < panel["gridPos"]["y"] < memory
    names = [n for t in panel["targets"] for n in _metric_names(t["expr"])]
    assert names == [
        "finetune_train_reward_chosen",
        "finetune_train_reward_rejected",
        "finetune_train_reward_margin",
        "finetune_train_preference_accuracy",
        "finetune_eval_preference_accuracy",
    ]


def test_operator_dashboard_shows_every_operator_metric() -> None:
    from finetune_operator.reconcile import metrics

    suffix = {"counter": "_total", "histogram": "_bucket", "gauge": ""}
    families = [m.describe()[0] for m in vars(metrics).values() if hasattr(m, "describe") and hasattr(m, "_name")]
    names = {f.name + suffix[f.type] for f in families}
    used = {n for _, t in targets(load("operator.json")) for n in _metric_names(t["expr"])}
    assert len(names) >= 8, "metric objects of the operator's metrics module"
    assert names - used == set()
    assert used - names == set(), "the dashboard reads a series the operator does not export"


def _metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(LABEL_CLAUSES.sub(" ", expr)))


def _needs_of(names: set[str]) -> str:
    if any(n.startswith("DCGM_") for n in names):
        return "dcgm"
    if any(n.startswith(("finetune_gpu_memory_", "finetune_activation_peak")) for n in names):
        return "gpu"
    return "any"


def test_gpu_only_and_dcgm_series_are_declared() -> None:
    """A target's declared needs match the series it reads, so the Prometheus test skips exactly those."""
    for q in panel_queries():
        names = _metric_names(q.expr)
        assert names, q
        assert q.needs == _needs_of(names), (q.panel, q.ref_id, names)
        assert q.needs_gpu == (q.needs != "any")


def test_dcgm_series_join_ranks_on_the_gpu_uuid() -> None:
    for q in panel_queries():
        if q.needs == "dcgm":
            assert "on (UUID) group_left (rank)" in q.expr and "finetune_trainer_info" in q.expr, q.panel
    assert any("DCGM_FI_DEV_FB_USED * 1048576" in q.expr for q in panel_queries()), "FB_USED is in MiB"


def test_queries_have_every_variable_substituted() -> None:
    queries = list(panel_queries({"job": "demo", "namespace": "team-a"}))
    assert len(queries) == sum(1 for name in FILES for _ in targets(load(name)))
    for q in queries:
        assert "$" not in q.expr, q
    assert any('finetune_job=~"demo"' in q.expr for q in queries)
    assert {q.dashboard for q in queries} == {d.uid for d in DASHBOARDS.values()}
    assert DEFAULT_VALUES["__rate_interval"]


def test_trainer_progress_metric_names_exist_in_the_trainer() -> None:
    """Names the trainer already defines (progress); memory and communication collectors come later."""
    from prometheus_client import CollectorRegistry

    from finetune_trainer.metrics.progress import ProgressMetrics

    registry = CollectorRegistry()
    ProgressMetrics(registry, {"rank": "0"})
    exported = {s.name for m in registry.collect() for s in m.samples}
    for q in panel_queries():
        for name in _metric_names(q.expr):
            if name.startswith(("finetune_train_", "finetune_eval_", "finetune_checkpoint_", "finetune_trainer_info")):
                assert name in exported, (q.panel, name)


PROMTOOL = shutil.which("promtool")


@pytest.mark.prometheus
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian's prometheus; bootstrap installs it)")
def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [{"record": f"dashboard:query{i}", "expr": q.expr} for i, q in enumerate(panel_queries())],
            }
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
