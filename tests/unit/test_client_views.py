"""The pure parts of the client and the day-two verbs: durations, states, progress lines, which
pod holds a rank, the apiserver's field messages, the measured memory, exit codes."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from finetune_operator.api import FineTuneJob
from finetune_operator.cli import describe_cmd, main, wait_cmd
from finetune_operator.cli.progress_display import ProgressDisplay
from finetune_operator.client import JobFailed, JobRejected, WaitTimeout
from finetune_operator.client.views import (
    apiserver_problems,
    container_started,
    format_duration,
    memory_from_metrics,
    parse_duration,
    parse_states,
    pod_index_of_rank,
    progress_line,
    rank_pod,
)
from tests.factories import job_document

NOW = "2026-12-05T17:00:00Z"


def job_with(status: dict[str, Any] | None = None, **spec: Any) -> FineTuneJob:
    doc = job_document(**spec)
    doc["metadata"] = {"name": "demo", "namespace": "ml"}
    if status is not None:
        doc["status"] = status
    return FineTuneJob.from_manifest(doc)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("45", 45), ("1.5h", 5400), ("2m30s", 150)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "2d", "-5s", "1h 2m", "soon"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "?"), (-1, "?"), (0, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m")]
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_parse_states() -> None:
    assert parse_states(["succeeded"]) == ("Succeeded",)
    assert parse_states(["Succeeded,failed", "FAILED"]) == ("Succeeded", "Failed")
    with pytest.raises(ValueError, match="unknown state 'Done'"):
        parse_states(["Done"])
    with pytest.raises(ValueError, match="no state given"):
        parse_states([","])


def test_progress_line() -> None:
    assert progress_line(job_with()) == "demo Pending"
    running = job_with(
        {
            "state": "Running",
            "restarts": 1,
            "progress": {"step": 12, "totalSteps": 40, "percent": 30, "loss": 1.23456, "tokensPerSecond": 1234.4,
                         "etaSeconds": 65},
        }
    )  # fmt: skip
    assert progress_line(running) == "demo Running step 12/40 (30%) loss 1.2346 1,234 tok/s ETA 1m05s restarts 1"
    done = job_with({"state": "Succeeded", "progress": {"step": 40, "totalSteps": 40, "percent": 100, "etaSeconds": 0}})
    assert progress_line(done) == "demo Succeeded step 40/40 (100%)"  # no ETA once finished


def pod(name: str, index: str | None, deleting: bool = False, uid: str = "u") -> dict[str, Any]:
    labels = {"finetune.dev/job-name": "demo"} | ({"apps.kubernetes.io/pod-index": index} if index else {})
    meta: dict[str, Any] = {"name": name, "uid": uid, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = NOW
    return {"metadata": meta}


def test_rank_to_pod() -> None:
    gpus = job_with(resources={"numNodes": 2, "gpusPerNode": 8, "gpuMemory": "80Gi"})
    assert [pod_index_of_rank(gpus, r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    cpu = job_with(resources={"numNodes": 2, "gpusPerNode": 0})
    assert [pod_index_of_rank(cpu, r) for r in (0, 1)] == [0, 1]
    with pytest.raises(ValueError, match=r"rank 2 is not in the job's world of 2 rank\(s\) \(0..1\)"):
        pod_index_of_rank(cpu, 2)


def test_rank_pod_skips_pods_being_deleted_and_reads_old_names() -> None:
    pods = [pod("demo-1", "1", deleting=True, uid="old"), pod("demo-0", "0"), pod("demo-1", "1", uid="new")]
    assert rank_pod(pods, 1) == pods[2]
    assert rank_pod(pods, 0) == pods[1]
    assert rank_pod(pods, 2) is None
    assert rank_pod([pod("demo-3", None)], 3) is not None  # before Kubernetes 1.28: the name's ordinal


@pytest.mark.parametrize(
    ("statuses", "started"),
    [
        ([], False),
        ([{"name": "trainer", "state": {"waiting": {"reason": "ContainerCreating"}}}], False),
        ([{"name": "trainer", "state": {"running": {"startedAt": NOW}}}], True),
        ([{"name": "trainer", "state": {"waiting": {}}, "lastState": {"terminated": {"exitCode": 1}}}], True),
        ([{"name": "other", "state": {"running": {}}}], False),
    ],
)
def test_container_started(statuses: list[dict[str, Any]], started: bool) -> None:
    assert container_started({"status": {"containerStatuses": statuses}}) is started


def test_apiserver_problems_one_line_per_cause() -> None:
    body = {
        "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
        "message": 'FineTuneJob.finetune.dev "x" is invalid: [...]',
        "details": {"causes": [
            {"reason": "FieldValueInvalid", "message": "Invalid value: -1: should be >= 1", "field": "spec.a"},
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.b"},
        ]},
    }  # fmt: skip
    assert apiserver_problems(json.dumps(body)) == [
        "spec.a: Invalid value: -1: should be >= 1",
        "spec.b: Required value",
    ]
    assert apiserver_problems(json.dumps({"message": "forbidden"})) == ["forbidden"]
    assert apiserver_problems("<html>bad gateway</html>") == ["<html>bad gateway</html>"]
    assert apiserver_problems(None) == []


def test_errors_say_what_happened() -> None:
    rejected = JobRejected("job.yaml", ["job.yaml[0] (x): spec.a: bad", "spec.b: bad"])
    assert str(rejected) == "job.yaml[0] (x): spec.a: bad\njob.yaml: spec.b: bad"
    assert rejected.exit_code == 2
    timeout = WaitTimeout("demo", ("Succeeded",), 7200, job_with({"state": "Running", "progress": {"step": 3}}))
    assert str(timeout) == "timed out after 2h waiting for demo to be Succeeded: it is Running, step 3"
    assert timeout.exit_code == 124 and isinstance(timeout, TimeoutError)
    assert str(WaitTimeout("demo", ("Running", "Failed"), 2.5, None)) == (
        "timed out after 2.5s waiting for demo to be Running or Failed: it is not started"
    )
    failed = job_with(
        {"state": "Failed", "lastFailure": {"reason": "BackoffLimitExceeded", "message": "rank 1 exited 1"}}
    )
    assert str(JobFailed(failed)) == "demo failed: BackoffLimitExceeded: rank 1 exited 1"


def test_memory_from_metrics_sums_components_of_rank_0() -> None:
    text = "\n".join(
        [
            "# TYPE finetune_model_state_bytes gauge",
            'finetune_model_state_bytes{rank="0",component="weights",device="cpu",trainable="true"} 100.0',
            'finetune_model_state_bytes{rank="0",component="weights",device="cpu",trainable="false"} 900.0',
            'finetune_model_state_bytes{rank="0",component="gradients",device="cpu",trainable="true"} 100.0',
            'finetune_model_state_bytes{rank="1",component="gradients",device="cpu",trainable="true"} 7.0',
            "# TYPE process_resident_memory_bytes gauge",
            "process_resident_memory_bytes 5e+08",
        ]
    )
    assert memory_from_metrics(text + "\n") == {"weights": 1000.0, "gradients": 100.0, "resident": 5e8}


def test_progress_display_plain_lines_only_on_change() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, tty=False)
    running = job_with({"state": "Running", "progress": {"step": 1, "totalSteps": 4}})
    for job in (running, running, job_with({"state": "Running", "progress": {"step": 2, "totalSteps": 4}})):
        display(job)
    display.close()
    assert out.getvalue().splitlines() == ["demo Running step 1/4", "demo Running step 2/4"]


def test_progress_display_bar_on_a_terminal() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, tty=True)
    display(job_with({"state": "Running", "progress": {"step": 3, "totalSteps": 4, "loss": 0.5, "etaSeconds": 9}}))
    display.close()
    text = out.getvalue()
    assert "demo Running  75%|" in text and "3/4" in text and "loss 0.5000" in text and "ETA 9s" in text, text


def test_describe_text() -> None:
    job = job_with(
        {
            "state": "Succeeded",
            "restarts": 1,
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "Completed", "lastTransitionTime": NOW}],
            "plan": {"zeroStage": 2, "microBatchSize": 8, "gradientAccumulationSteps": 1, "perGpuBytes": 2**31,
                     "gpuMemoryBytes": 2**36, "breakdown": {"weights": 2**30}},
            "progress": {"step": 40, "totalSteps": 40, "percent": 100},
            "result": {"adapterUri": "pvc://out/demo/adapter", "finalLoss": 0.25, "evalLossBefore": 3.0,
                       "evalLoss": 1.0, "steps": 40, "tokens": 12345, "wallSeconds": 61},
        }
    )  # fmt: skip
    from finetune_operator.client import JobEvent

    events = [JobEvent("Normal", f"R{i}", f"m{i}", 1, f"2026-12-05T17:00:{i:02d}Z") for i in range(12)]
    text = describe_cmd.describe(job, events, {"weights": 2**29}, last=3)
    assert "State:       Succeeded" in text
    assert "  weights               1.00 GiB    512.0 MiB\n" in text
    assert "  total                 2.00 GiB            -\n" in text
    assert "  adapter     pvc://out/demo/adapter\n" in text and "  eval loss   3.0000 -> 1.0000" in text
    assert "  steps       40, 12,345 tokens in 1m01s" in text
    assert job.status is not None
    running = job.model_copy(update={"status": job.status.model_copy(update={"state": "Running"})})
    assert "  (nothing measured: no pod of rank 0)\n" in describe_cmd.describe(running, [], "no pod of rank 0")
    assert text.endswith("Events (last 3 of 12):\n"
                         "  2026-12-05T17:00:09Z  Normal  R9: m9\n"
                         "  2026-12-05T17:00:10Z  Normal  R10: m10\n"
                         "  2026-12-05T17:00:11Z  Normal  R11: m11")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["wait", "demo", "--for", "Done"], "ftjob wait: unknown state 'Done'"),
        (["wait", "demo", "--timeout", "2 days"], "ftjob wait: not a duration"),
        (["submit", "-f", "x.yaml", "--timeout", "soon"], "ftjob submit: not a duration"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(argv) == 2
    assert capsys.readouterr().err.startswith(message)


def test_no_cluster_exits_1(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main.main(["describe", "demo", "--kubeconfig", str(missing)]) == 1
    assert capsys.readouterr().err.startswith("cannot reach a cluster: ")


def test_wait_parser_defaults() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    wait_cmd.configure(parser)
    args = parser.parse_args(["demo"])
    assert (args.states, args.timeout, args.namespace, args.quiet) == (None, "", None, False)
    assert "124 timed out" in (parser.epilog or "")
