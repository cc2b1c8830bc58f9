"""Experiment tracking on the operator's side: the spec, what the pods get, what rank 0 reports,
and how it reaches the status and Events. No tracking server: the operator never talks to one."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.api.tracking import TrackingResult, mlflow_settings
from finetune_operator.cli.main import main
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.reconcile.tracking import TrackingReport, parse_report
from finetune_operator.render.manifests import gang_hash, render_all
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document, make_job
from tests.support.lifecycle import NOW, exited, job_with, pod, reasons, run, step

URI = "http://mlflow.mlflow.svc:5000"


def _pod_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in env}


def _job_json(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    return dict(json.loads(config["data"]["job.json"]))


# ----------------------------------------------------------------------------- the spec


MALFORMED = (
    "mlflow.example.com",
    "ftp://mlflow.example.com",
    "http://user:secret@mlflow.example.com",
    "http://m.io/x?a=1",
    "http:// spaced.example.com",
)


@pytest.mark.parametrize("uri", MALFORMED)
def test_validate_refuses_a_malformed_tracking_uri_naming_the_field(
    uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_document(tracking={"mlflow": {"trackingUri": uri}})))
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.tracking.mlflow.trackingUri: invalid value" in err and "http:// or https:// URL" in err, err


@pytest.mark.parametrize(
    "uri", ["http://127.0.0.1:5000", "https://mlflow.example.com/prefix", "http://[::1]:5000", "http://mlflow"]
)
def test_validate_accepts_tracking_servers(uri: str, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_document(tracking={"mlflow": {"trackingUri": uri, "experiment": "team a"}})))
    assert main(["validate", str(path)]) == 0


def test_the_operators_default_uri_applies_unless_the_job_names_one_or_opts_out() -> None:
    assert mlflow_settings(None, None) is None
    default = mlflow_settings(None, URI)
    assert default is not None and default.tracking_uri == URI
    own = make_job(tracking={"mlflow": {"trackingUri": "http://other:5000", "experiment": "x"}}).spec.tracking
    assert (settings := mlflow_settings(own, URI)) is not None and settings.tracking_uri == "http://other:5000"
    named = make_job(tracking={"mlflow": {"experiment": "x"}}).spec.tracking
    assert (settings := mlflow_settings(named, URI)) is not None and (settings.tracking_uri, settings.experiment) == (
        URI,
        "x",
    )
    assert mlflow_settings(named, None) is None
    off = make_job(tracking={"mlflow": {"enabled": False}}).spec.tracking
    assert mlflow_settings(off, URI) is None


# ----------------------------------------------------------------------------- what the pods get


def _uid_job(**spec: Any) -> Any:
    job = make_job(**spec)
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": "1234-uid"})})


def test_an_untracked_job_renders_as_before() -> None:
    job = _uid_job()
    objects = render_all(job, fixed_plan(job.spec), RenderOptions(), 1)
    env = _pod_env(objects)
    assert not {"FTJOB_JOB_UID", "FTJOB_IMAGE", "MLFLOW_TRACKING_TOKEN"} & set(env)
    assert "tracking" not in _job_json(objects)["spec"]


def test_the_default_uri_is_written_into_the_pods_job_and_the_uid_into_their_env() -> None:
    job = _uid_job()
    options = RenderOptions(default_tracking_uri=URI, trainer_image="registry/trainer:1")
    objects = render_all(job, fixed_plan(job.spec), options, 1)
    assert _job_json(objects)["spec"]["tracking"] == {"mlflow": {"enabled": True, "trackingUri": URI}}
    env = _pod_env(objects)
    assert env["FTJOB_JOB_UID"] == "1234-uid" and env["FTJOB_IMAGE"] == "registry/trainer:1"
    assert gang_hash(job, fixed_plan(job.spec), options) != gang_hash(job, fixed_plan(job.spec), RenderOptions())


def test_credentials_reach_the_pods_only_as_optional_secret_refs() -> None:
    job = _uid_job(
        tracking={"mlflow": {"trackingUri": URI, "secretRef": {"name": "mlflow-auth", "passwordKey": "pw"}}},
        env=[{"name": "MLFLOW_TRACKING_USERNAME", "value": "ci-bot"}],
    )
    env = _pod_env(render_all(job, fixed_plan(job.spec), RenderOptions(), 1))
    assert env["MLFLOW_TRACKING_TOKEN"] == {"secretKeyRef": {"name": "mlflow-auth", "key": "token", "optional": True}}
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"secretKeyRef": {"name": "mlflow-auth", "key": "pw", "optional": True}}
    assert env["MLFLOW_TRACKING_USERNAME"] == "ci-bot"  # the job's own env wins, once


def test_the_uid_and_image_env_names_are_reserved() -> None:
    from pydantic import ValidationError

    from finetune_operator.api import FineTuneJob

    for name in ("FTJOB_JOB_UID", "FTJOB_IMAGE"):
        with pytest.raises(ValidationError, match="reserved"):
            FineTuneJob.from_manifest(job_document(env=[{"name": name, "value": "x"}]))


def test_run_refuses_a_malformed_tracking_uri(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_document()))
    assert main(["run", str(path), "--tracking-uri", "mlflow:5000"]) == 2
    assert "--tracking-uri: invalid value 'mlflow:5000'" in capsys.readouterr().err


def test_the_operator_refuses_a_malformed_default_uri() -> None:
    with pytest.raises(SystemExit, match="--default-tracking-uri: invalid value 'ftp://x'"):
        main(["operator", "--default-tracking-uri", "ftp://x"])


@pytest.mark.parametrize("endpoint", ["hf-mirror.example.com", "https://hub:99999", "https://u:p@hub"])
def test_the_operator_refuses_a_hub_endpoint_that_is_no_url(endpoint: str) -> None:
    with pytest.raises(SystemExit, match=f"--hub-endpoint: invalid value '{re.escape(endpoint)}': must be an http"):
        main(["operator", "--hub-endpoint", endpoint])


# ----------------------------------------------------------------------------- rank 0's report

SCRAPE = """\
# TYPE finetune_train_global_step gauge
finetune_train_global_step 12.0
# TYPE finetune_tracking_info gauge
finetune_tracking_info{experiment_id="3",run_id="abc",run_url="http://m/#/experiments/3/runs/abc",tensorboard_dir="/out/tensorboard",tracking_uri="http://m"} 1.0
# TYPE finetune_tracking_failing gauge
finetune_tracking_failing{reason="%s",sink="mlflow"} %d
finetune_tracking_failing{reason="",sink="tensorboard"} 0
# TYPE finetune_tracking_pending_records gauge
finetune_tracking_pending_records{sink="mlflow"} 17.0
"""  # noqa: E501


def test_the_report_is_parsed_from_rank_0s_metrics() -> None:
    report = parse_report(SCRAPE % ("unreachable", 1))
    assert report is not None and report.tracking_uri == "http://m" and report.pending == 17
    assert report.result == TrackingResult(
        run_id="abc",
        experiment_id="3",
        run_url="http://m/#/experiments/3/runs/abc",
        tensorboard_log_dir="/out/tensorboard",
        failing=True,
        reason="unreachable",
    )
    healthy = parse_report(SCRAPE % ("", 0))
    assert healthy is not None and healthy.result.failing is False and healthy.result.reason is None
    assert parse_report("# TYPE finetune_train_global_step gauge\nfinetune_train_global_step 3\n") is None
    assert parse_report("not {prometheus") is None


def _report(failing: bool | None, run_id: str | None = "abc", pending: int = 5) -> TrackingReport:
    result = TrackingResult(run_id=run_id, run_url=f"http://m/#/experiments/1/runs/{run_id}" if run_id else None,
                            failing=failing, reason="HTTP 503" if failing else None)  # fmt: skip
    return TrackingReport(result, "http://m", pending)


def test_the_run_reaches_the_status_while_running_and_failing_is_one_warning() -> None:
    job, _ = step(job_with(), [])
    job, decision = step(job, [pod(0), pod(1)], tracking_report=_report(False))
    assert job.status is not None and job.status.result is not None
    assert job.status.result.tracking == _report(False).result
    assert "TrackingFailing" not in reasons(decision) and job.status.state == "Running"
    job, failing = step(job, [pod(0), pod(1)], tracking_report=_report(True, pending=9))
    warning = next(e for e in failing.events if e.reason == "TrackingFailing")
    assert warning.type == "Warning" and warning.message == (
        "rank 0 cannot publish to MLflow at http://m (HTTP 503); training goes on, and the 9 records waiting on "
        "the output volume are sent when the server answers"
    )
    assert job.status is not None and job.status.state == "Running"  # a Warning, never a failure
    job, again = step(job, [pod(0), pod(1)], tracking_report=_report(True, pending=12))
    assert "TrackingFailing" not in reasons(again)
    job, between = step(job, [pod(0), pod(1)])  # no scrape this pass: nothing changes
    assert not [r for r in reasons(between) if r.startswith("Tracking")]
    job, recovered = step(job, [pod(0), pod(1)], tracking_report=_report(False))
    event = next(e for e in recovered.events if e.reason == "TrackingRecovered")
    assert event.type == "Normal"
    assert job.status is not None and job.status.result is not None and job.status.result.tracking is not None
    assert job.status.result.tracking.failing is False


def test_a_new_gang_keeps_the_run_until_its_rank_0_names_it() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0), pod(1)], tracking_report=_report(False))
    later = NOW + timedelta(seconds=30)
    job, _ = step(job, [pod(0, created=later), pod(1, created=later)], tracking_report=_report(None, run_id=None))
    assert job.status is not None and job.status.result is not None and job.status.result.tracking is not None
    assert job.status.result.tracking.run_id == "abc"


def test_success_takes_the_run_from_the_summary_and_warns_about_unpublished_records() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0), pod(1)], tracking_report=_report(True))
    tracking = {"runId": "abc", "runUrl": "http://m/#/experiments/1/runs/abc", "unpublishedRecords": 4,
                "reason": "unreachable", "futureField": 1}  # fmt: skip
    summary = json.dumps({"steps": 8, "tokens": 1, "finalLoss": 0.5, "tracking": tracking})
    decision = run(job, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    status = decision.status
    assert status.state == "Succeeded" and status.result is not None and status.result.tracking is not None
    assert status.result.tracking.run_id == "abc" and status.result.tracking.unpublished_records == 4
    assert status.result.tracking.failing is None and status.result.steps == 8
    warning = next(e for e in decision.events if e.reason == "TrackingIncomplete")
    assert warning.type == "Warning" and warning.message.startswith("4 records were not published to MLflow")


def test_success_without_tracking_in_the_summary_keeps_the_run_the_status_knew() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0), pod(1)], tracking_report=_report(False))
    summary = json.dumps({"steps": 8, "tokens": 1})
    decision = run(job, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    assert decision.status.result is not None and decision.status.result.tracking is not None
    assert decision.status.result.tracking.run_id == "abc" and decision.status.result.steps == 8
    assert "TrackingIncomplete" not in reasons(decision)
