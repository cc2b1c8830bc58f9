"""Every dashboard query against a real Prometheus that scraped real runs and a real operator.

Debian's `prometheus` scrapes (1 s) a 2-rank CPU training run of the demo model under
ZeRO-2, then another under ZeRO-3, each rank's exporter on its own port, and a real
`ftjob operator` process started with an unreachable API server (it starts, initialises
and serves its metrics, retries the API for about a minute and exits; nothing is
reconciled, and its dashboard is evaluated at its last scrape). Then every target
of both dashboards, template variables substituted, is evaluated through the HTTP API at
the end of each run: it must parse and return at least one series, except the targets
whose `needs` is gpu or dcgm, listed explicitly below, which must parse. `promtool`
checks the generated scrape config (the chart's rule files: test_alert_rules.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.prometheus_server import (
    PROMTOOL,
    OperatorProcess,
    PrometheusServer,
    TrainerTarget,
    free_port_pair,
    scrape_config,
    wait_until,
)
from tests.support.training_runs import Run, job_manifest, render_config, start_train
from tools.dashboards import panel_queries

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(2400)]

NAMESPACE = "ml-test"
STEPS = {2: 240, 3: 80}
# The targets that cannot return data on a CPU run, by (dashboard, panel, ref_id): allocator
# statistics exist only with torch.cuda, dcgm-exporter series only with NVIDIA GPUs.
EXPECTED_EMPTY = {("finetune-training-job", "Allocator memory by rank", ref): "gpu" for ref in "ABCD"} | {
    ("finetune-training-job", "Headroom by rank", "A"): "gpu",
    ("finetune-training-job", "Activation peak by rank", "A"): "gpu",
    ("finetune-training-job", "Allocator retries and OOMs", "A"): "gpu",
    ("finetune-training-job", "Allocator retries and OOMs", "B"): "gpu",
    ("finetune-training-job", "Framebuffer used vs PyTorch reserved", "A"): "dcgm",
    ("finetune-training-job", "Framebuffer used vs PyTorch reserved", "B"): "gpu",
    ("finetune-training-job", "Tensor core activity", "A"): "dcgm",
    ("finetune-training-job", "GPU utilisation", "A"): "dcgm",
    ("finetune-training-job", "PCIe receive", "A"): "dcgm",
}


def demo_manifest(stage: int, name: str) -> dict[str, Any]:
    manifest = job_manifest(
        "builtin://tiny-llama",
        "builtin://reverse-words",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.01},
        method={"type": "lora", "lora": {"r": 16, "alpha": 32, "dropout": 0.0}},
        training={"maxSteps": STEPS[stage], "microBatchSize": 4, "globalBatchSize": 8, "precision": "fp32",
                  "learningRate": 0.003, "warmupRatio": 0.05},
        deepspeed={"zeroStage": stage},
    )  # fmt: skip
    manifest["metadata"]["name"] = name
    return manifest


def plan_config(directory: Path, manifest: dict[str, Any]) -> Path:
    """The config files under the real planner's plan, so the planned-memory series carry its breakdown."""
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import choose_plan
    from finetune_operator.render.config_files import config_files

    render_config(directory, manifest)  # hostfile and layout as the trainer tier does
    job = FineTuneJob.from_manifest(manifest)
    hostfile = (directory / "hostfile").read_text()
    for name, content in config_files(job, choose_plan(job.spec), hostfile).items():
        (directory / name).write_text(content)
    return directory


def train(tmp_path: Path, stage: int, target: TrainerTarget, prom: PrometheusServer) -> float:
    """Run one job to completion while Prometheus scrapes it; return the time of its last scrape."""
    config = plan_config(tmp_path / f"config-{stage}", demo_manifest(stage, target.finetune_job))
    env = {"FTJOB_METRICS_PORT": str(target.base_port), "FTJOB_POD_IP": "127.0.0.1"}
    run: Run = start_train(config, tmp_path / f"out-{stage}", env=env, tag=f"zero{stage}")
    try:
        assert run.wait(1080) == 0, run.log()[-3000:]
    finally:
        run.kill()
    # The ranks have exited: their series went stale at the first failed scrape, so look back.
    # Under load the scrape of the very last step can be missed (the ranks exit within a second
    # of it), so "finished" means both ranks were seen past half of the run.
    selector = f'finetune_job="{target.finetune_job}"'
    done = f"count(max_over_time(finetune_train_global_step{{{selector}}}[10m]) >= {STEPS[stage] // 2}) == 2"
    seen = f"max_over_time(finetune_train_global_step{{{selector}}}[10m]) or max_over_time(up{{{selector}}}[10m])"
    wait_until(
        lambda: bool(prom.query(done)["data"]["result"]),
        60,
        f"{target.finetune_job} finished in Prometheus; seen: {prom.query(seen)['data']['result']}",
    )
    last = prom.query(f"max(max_over_time(timestamp(finetune_train_global_step{{{selector}}})[10m:1s]))")
    return float(last["data"]["result"][0]["value"][1])


def evaluate(prom: PrometheusServer, values: dict[str, str], at: float, dashboards: set[str]) -> list[str]:
    problems = []
    for q in panel_queries(values):
        if q.dashboard not in dashboards:
            continue
        answer = prom.query(q.expr, at)
        key = (q.dashboard, q.panel, q.ref_id)
        if answer.get("status") != "success":
            problems.append(f"{key}: does not evaluate: {answer.get('error')}\n    {q.expr}")
            continue
        series = answer["data"]["result"]
        if key in EXPECTED_EMPTY:
            assert q.needs == EXPECTED_EMPTY[key], f"{key} is listed as {EXPECTED_EMPTY[key]} but needs {q.needs}"
            continue
        if q.needs != "any":
            problems.append(f"{key} needs {q.needs} but is not listed in EXPECTED_EMPTY")
        elif not series:
            problems.append(f"{key}: no series\n    {q.expr}")
    return problems


def test_every_panel_query_returns_data(tmp_path: Path, operator_process: OperatorProcess) -> None:
    trainers = {stage: TrainerTarget(f"tiny-zero{stage}", free_port_pair()) for stage in (2, 3)}
    prom = PrometheusServer(tmp_path, scrape_config(NAMESPACE, list(trainers.values()), operator_process.port))
    command = [PROMTOOL, "check", "config", str(prom.config_path)]
    checked = subprocess.run(command, check=False, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    prom.start()
    try:
        wait_until(lambda: bool(prom.query('up{job="finetune-operator"} == 1')["data"]["result"]), 30, "operator up")
        ends = {stage: train(tmp_path, stage, target, prom) for stage, target in trainers.items()}
        problems = []
        for stage, target in trainers.items():
            values = {"namespace": NAMESPACE, "job": target.finetune_job, "rank": ".*", "__range": "15m"}
            problems += [f"ZeRO-{stage} {p}" for p in evaluate(prom, values, ends[stage], {"finetune-training-job"})]
        # Without an API server kopf gives up after about a minute of retries and the process exits:
        # its dashboard is evaluated at the operator's last scrape, looked for over the whole test
        # (the two trainings took 17 min at load 16, and a 15 min window had lost the operator)
        last_operator = prom.query("max(max_over_time(timestamp(finetune_operator_build_info)[2h:1s]))")
        operator_end = float(last_operator["data"]["result"][0]["value"][1])
        problems += evaluate(prom, {"namespace": NAMESPACE}, operator_end, {"finetune-operator"})
        assert not problems, "\n".join(problems)
        listed = {(q.dashboard, q.panel, q.ref_id) for q in panel_queries() if q.needs != "any"}
        assert listed == set(EXPECTED_EMPTY), "EXPECTED_EMPTY must list exactly the gpu/dcgm targets"
        _render_panels(prom, tmp_path)
    finally:
        prom.stop()


def _render_panels(prom: PrometheusServer, tmp_path: Path) -> None:
    """Draw the README pictures from the ZeRO-2 run (into FTJOB_PANELS_OUT when set)."""
    from tools.panels import PNG_NAMES, render_all

    out = Path(os.environ.get("FTJOB_PANELS_OUT") or tmp_path / "panels")
    written = render_all(prom.url, out, namespace=NAMESPACE, job="tiny-zero2", lookback_s=7200)  # the whole test
    assert [p.name for p in written] == list(PNG_NAMES)
    assert all(p.stat().st_size > 5000 for p in written)
