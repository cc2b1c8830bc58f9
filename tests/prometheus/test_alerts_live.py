"""The chart's alerts in a real Prometheus, on real scrapes of real ranks and a real operator.

Debian's `prometheus` (1 s scrapes and rule evaluations) loads the chart's rule files with every
`for` cut to a few seconds (the expressions are evaluated exactly as shipped; promtool's unit
tests, tests/prometheus/alerts.test.yaml, check the `for` durations) and scrapes, one after the
other:

- a 2-rank CPU run of the demo model whose ranks sleep for STALL_SECONDS after step STALL_AT
  (FTJOB_FAULT_SLOW: they stop stepping while their exporters keep serving, as a hung
  collective does). FineTuneJobStalled must stay quiet before the stall, fire during it with
  the job's labels and runbook, and clear once the steps resume;
- a 2-rank run in fp16 at the highest learning rate the API allows: its loss is NaN from the
  second step, and DeepSpeed ends it when the loss scale reaches its minimum ("Current loss
  scale already at minimum"). FineTuneLossNotFinite must fire, after the ranks are gone, from
  the samples they exported;
- a real `ftjob operator` process, then stopped: FineTuneOperatorDown must fire.

The stalling job is tracked to an MLflow address where nothing listens, so rank 0 exports its
sink as failing: FineTuneTrackingFailing must fire for it too.

Each alert must also stay quiet on the other targets (no NaN alert for the stalled job, no
stall alert for the NaN job).
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster.ports import free_port
from tests.support.prometheus_server import (
    OperatorProcess,
    PrometheusServer,
    TrainerTarget,
    free_port_pair,
    scrape_config,
    wait_until,
)
from tests.support.s3 import BUCKET, committed_steps, job_storage, key_env, running_s3
from tests.support.training_runs import METHODS, REPO, job_manifest, render_config, start_train

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(1800)]

NAMESPACE = "ml-alerts"
RULES = REPO / "charts" / "finetune-operator" / "rules"
FOR = "3s"
STEPS, STALL_AT, STALL_SECONDS = 60, 25, 45


def live_rules(directory: Path) -> tuple[Path, ...]:
    """The chart's rule files, every `for` cut to FOR (nothing else changed)."""
    written = []
    for path in sorted(RULES.glob("*.yaml")):
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = FOR
        out = directory / path.name
        out.write_text(yaml.safe_dump(rules, sort_keys=False))
        written.append(out)
    return tuple(written)


def manifest(name: str, method: str = "lora", **training: Any) -> dict[str, Any]:
    job = job_manifest(
        "builtin://tiny-llama",
        "builtin://reverse-words",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.01},
        method=METHODS[method],
        training={"maxSteps": STEPS, "microBatchSize": 4, "globalBatchSize": 8, "precision": "fp32",
                  "learningRate": 0.003, "warmupRatio": 0.05, **training},
    )  # fmt: skip
    job["metadata"]["name"] = name
    return job


def firing(prom: PrometheusServer, alertname: str, job: str | None = None) -> list[dict[str, Any]]:
    return [
        a
        for a in prom.alerts()
        if a["labels"]["alertname"] == alertname
        and a["state"] == "firing"
        and (job is None or a["labels"].get("finetune_job") == job)
    ]


def step_of(prom: PrometheusServer, job: str) -> float | None:
    result = prom.query(f'min(finetune_train_global_step{{finetune_job="{job}"}})')["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def stalled_job(tmp_path: Path, prom: PrometheusServer, target: TrainerTarget) -> dict[str, Any]:
    """Run the stalling job (tracked to an MLflow server that is not there), watching Prometheus;
    return what was seen."""
    manifest_ = manifest(target.finetune_job)
    manifest_["spec"]["tracking"] = {"mlflow": {"trackingUri": f"http://127.0.0.1:{free_port()}", "experiment": "x"}}
    config = render_config(tmp_path / "config-stall", manifest_)
    env = {
        "FTJOB_METRICS_PORT": str(target.base_port),
        "FTJOB_POD_IP": "127.0.0.1",
        "FTJOB_FAULT_SLOW": f"step:{STALL_AT}",
        "FTJOB_FAULT_SLOW_SECONDS": str(STALL_SECONDS),
        "FTJOB_TRACKING_FLUSH_SECONDS": "3",
    }
    run = start_train(config, tmp_path / "out-stall", env=env, tag="stall")
    seen: list[tuple[float, float | None, bool]] = []  # (time, step as scraped, alert firing)
    alert: dict[str, Any] | None = None
    tracking: dict[str, Any] | None = None
    try:
        while run.proc.poll() is None:
            now, step, alerts = time.time(), step_of(prom, target.finetune_job), firing(prom, "FineTuneJobStalled")
            seen.append((now, step, bool(alerts)))
            alert = alert or next((a for a in alerts if a["labels"].get("finetune_job") == target.finetune_job), None)
            tracking = tracking or next(iter(firing(prom, "FineTuneTrackingFailing", target.finetune_job)), None)
            time.sleep(0.5)
        assert run.wait(60) == 0, run.log()[-3000:]
    finally:
        run.kill()
    assert alert is not None, f"FineTuneJobStalled never fired; seen (time, step, firing): {seen}"
    assert tracking is not None, "FineTuneTrackingFailing never fired while MLflow was unreachable"
    return {"seen": seen, "alert": alert, "tracking": tracking}


def test_stalled_nan_and_operator_down_alerts_fire_on_real_scrapes(
    tmp_path: Path, operator_process: OperatorProcess
) -> None:
    stall, nan = TrainerTarget("stalls", free_port_pair()), TrainerTarget("diverges", free_port_pair())
    rules = live_rules(tmp_path)
    config = scrape_config(NAMESPACE, [stall, nan], operator_process.port, rules, {"namespace": "ftjob-system"})
    prom = PrometheusServer(tmp_path, config)
    prom.start()
    try:
        # the operator serves (it exits by itself about a minute later: no API server behind it)
        served = 'sum_over_time(up{job="finetune-operator"}[10s]) >= 6'
        wait_until(lambda: bool(prom.query(served)["data"]["result"]), 60, "6 s of operator scrapes")
        assert not firing(prom, "FineTuneOperatorDown"), "FineTuneOperatorDown fired while the operator served"

        # ---- a job that stalls, then goes on
        began = time.time()
        watched = stalled_job(tmp_path, prom, stall)
        seen, alert = watched["seen"], watched["alert"]
        assert watched["tracking"]["labels"]["sink"] == "mlflow", watched["tracking"]
        assert watched["tracking"]["labels"]["namespace"] == NAMESPACE
        before = [s for s in seen if s[1] is not None and s[1] < STALL_AT]
        during = [s for s in seen if s[1] == STALL_AT and s[2]]
        after = [s for s in seen if s[1] is not None and STALL_AT + 10 <= s[1] < STEPS]
        assert before and not any(s[2] for s in before), "FineTuneJobStalled fired while the job was stepping"
        assert during, f"FineTuneJobStalled never fired during the {STALL_SECONDS} s stall at step {STALL_AT}"
        assert after and not after[-1][2], "FineTuneJobStalled still fired after the steps resumed"
        assert alert["labels"]["namespace"] == NAMESPACE and alert["labels"]["finetune_job"] == stall.finetune_job
        assert (
            alert["annotations"]["runbook"] and f"{NAMESPACE}/{stall.finetune_job}" in alert["annotations"]["summary"]
        )
        stall_start = min(t for t, step, _ in seen if step == STALL_AT)
        fired_after = min(t for t, _, _ in during) - stall_start
        took = time.time() - began
        print(f"FineTuneJobStalled fired {fired_after:.1f} s after the stall was scraped (for {FOR}); run {took:.0f} s")

        # ---- a job whose loss becomes NaN, and dies of it
        nan_config = render_config(
            tmp_path / "config-nan",
            manifest(nan.finetune_job, "full", precision="fp16", learningRate=1.0, warmupRatio=0.0),
        )
        env = {"FTJOB_METRICS_PORT": str(nan.base_port), "FTJOB_POD_IP": "127.0.0.1"}
        run = start_train(nan_config, tmp_path / "out-nan", env=env, tag="nan")
        try:
            code = run.wait(600)
        finally:
            run.kill()
        exited = time.time()
        losses = run.losses()
        assert code != 0 and "loss scale already at minimum" in run.log(), run.log()[-3000:]
        assert any(math.isnan(v) for v in losses.values()), f"the run never produced a NaN loss: {losses}"
        # the ranks are gone (their targets down), and the alert fires from what they exported
        down = f'count(up{{finetune_job="{nan.finetune_job}"}} == 0) == 2'
        wait_until(lambda: bool(prom.query(down)["data"]["result"]), 30, "the NaN job's targets down")
        wait_until(lambda: bool(firing(prom, "FineTuneLossNotFinite", nan.finetune_job)), 60, "FineTuneLossNotFinite")
        (nan_alert,) = firing(prom, "FineTuneLossNotFinite", nan.finetune_job)
        active = datetime.fromisoformat(nan_alert["activeAt"].replace("Z", "+00:00")[:26] + "+00:00").timestamp()
        nan_steps = sum(math.isnan(v) for v in losses.values())
        print(f"FineTuneLossNotFinite active {exited - active:.1f} s before the ranks exited ({nan_steps} NaN steps)")
        assert not firing(prom, "FineTuneLossNotFinite", stall.finetune_job), "the stalled job's loss was finite"
        assert not firing(prom, "FineTuneJobStalled", nan.finetune_job), "the NaN job never stalled"
        assert not firing(prom, "FineTuneTrackingFailing", nan.finetune_job), "the NaN job is not tracked"
        assert nan_alert["labels"]["namespace"] == NAMESPACE and nan_alert["annotations"]["runbook"]

        # ---- the operator, stopped (if it has not exited already)
        operator_process.stop()
        wait_until(lambda: bool(firing(prom, "FineTuneOperatorDown")), 60, "FineTuneOperatorDown")
        (operator_down,) = firing(prom, "FineTuneOperatorDown")
        labels = operator_down["labels"]
        assert labels["namespace"] == "ftjob-system" and labels["job"] == "finetune-operator", labels
    finally:
        prom.stop()


def test_object_storage_alert_fires_while_the_store_is_away(tmp_path: Path) -> None:
    target = TrainerTarget("uploads", free_port_pair())
    operator_port = free_port()  # no operator here: its target is down, and nothing below reads it
    prom = PrometheusServer(tmp_path, scrape_config(NAMESPACE, [target], operator_port, live_rules(tmp_path)))
    with running_s3(tmp_path / "s3") as s3:
        storage = job_storage(s3) | {"retryTimeoutSeconds": 300}
        job = job_manifest(
            "builtin://tiny-llama",
            "builtin://reverse-words",
            f"s3://{BUCKET}/runs/uploads",
            dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.01},
            training={"maxSteps": STEPS, "microBatchSize": 4, "globalBatchSize": 8, "precision": "fp32",
                      "learningRate": 0.003, "checkpointEverySteps": 20},
            objectStorage=storage,
        )  # fmt: skip
        job["metadata"]["name"] = target.finetune_job
        config = render_config(tmp_path / "config-uploads", job)
        env = {**key_env(s3), "FTJOB_METRICS_PORT": str(target.base_port), "FTJOB_POD_IP": "127.0.0.1"}
        (tmp_path / "scratch").mkdir()
        prom.start()
        run = start_train(config, tmp_path / "scratch" / "output", env=env, tag="uploads")
        try:
            wait_until(lambda: (step_of(prom, target.finetune_job) or 0) >= 5, 600, "the job stepping")
            assert not firing(prom, "FineTuneObjectStorageFailing"), "fired while the store answered"
            failed = f'sum(finetune_object_storage_failed_attempts_total{{finetune_job="{target.finetune_job}"}})'
            assert float(prom.query(failed)["data"]["result"][0]["value"][1]) == 0, "no attempt failed yet"
            away = time.time()
            s3.stop()
            stopped = time.time() - away
            wait_until(
                lambda: bool(firing(prom, "FineTuneObjectStorageFailing", target.finetune_job)),
                240,
                "FineTuneObjectStorageFailing while the store is away",
            )
            took = time.time() - away
            print(f"FineTuneObjectStorageFailing fired {took:.1f} s after stopping the store (stop: {stopped:.1f} s)")
            (alert,) = firing(prom, "FineTuneObjectStorageFailing", target.finetune_job)
            assert alert["labels"]["namespace"] == NAMESPACE and alert["annotations"]["runbook"]
            assert float(prom.query(failed)["data"]["result"][0]["value"][1]) >= 5
            s3.start()
            assert run.wait(600) == 0, run.log()[-3000:]
        finally:
            run.kill()
            prom.stop()
        assert committed_steps(s3.client(), "runs/uploads"), "the checkpoints landed once the store was back"
