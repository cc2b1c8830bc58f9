"""End to end: a FineTuneJob tracked in a real MLflow server, through the operator and the process node.

The tiny CPU job runs its two ranks on the process node and publishes to PyPI's MLflow server
(sqlite store, artifacts through the server) on loopback. One job is killed after its step-4
checkpoint (both ranks, at step 6): the gang restart continues the same run, which ends with
exactly `maxSteps` loss steps, each once, the job's params and its adapter. Another job sees
its tracking server stopped for 30 s: the job is warned about, not failed, and the run gets
every step once the server is back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube
from finetune_localcluster.devtools import OperatorProcess, bind_claim, kubectl
from finetune_localcluster.mlflow_server import MlflowServer
from tests.cluster.operator_harness import Jobs
from tests.cluster.process_jobs import CLAIM, output_dir, tiny_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def tracked_job(namespace: str, uri: str, max_steps: int, checkpoint_every: int, env: dict[str, str]) -> str:
    doc = tiny_job(namespace, max_steps=max_steps, checkpoint_every=checkpoint_every)
    doc["spec"]["tracking"] = {"mlflow": {"trackingUri": uri, "experiment": namespace}}
    doc["spec"]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    doc["spec"]["failurePolicy"] = {"backoffLimit": 2}
    return yaml.safe_dump(doc)


def the_run(url: str, experiment: str, uid: str) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(found) == 1, [r.info.run_id for r in found]
    assert found[0].data.tags["ftjob.uid"] == uid
    return found[0]


def loss_steps(url: str, run_id: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(tracking_uri=url).get_metric_history(run_id, "loss"))


@pytest.fixture
def tiny(kube: Kube, restricted_namespace: str, operator: OperatorProcess) -> Iterator[Jobs]:
    bind_claim(kube, restricted_namespace, CLAIM)
    jobs = Jobs(kube, restricted_namespace)
    yield jobs


def test_a_gang_restart_continues_one_run_with_every_step_once(
    tiny: Jobs, kubeconfig: Path, mlflow_server: MlflowServer, operator: OperatorProcess
) -> None:
    max_steps = 12
    doc = tracked_job(tiny.ns, mlflow_server.url, max_steps, 4, {"FTJOB_FAULT_KILL": "step:6"})
    kubectl(kubeconfig, "apply", "-f", "-", stdin=doc)
    seen_while_running: dict[str, Any] = {}

    def finished(status: dict[str, Any]) -> bool:
        tracking = (status.get("result") or {}).get("tracking") or {}
        if status.get("state") == "Running" and tracking.get("runId"):
            seen_while_running.setdefault("tracking", tracking)
        return status.get("state") in ("Succeeded", "Failed")

    try:
        status = tiny.wait(finished, "the job to finish", name="tiny-cpu", timeout=840)
    except AssertionError:
        print(tiny.describe("tiny-cpu"), "\noperator log:", operator.log_tail())
        raise
    assert status["state"] == "Succeeded" and status["restarts"] == 1, tiny.describe("tiny-cpu")
    uid = tiny.get("tiny-cpu")["metadata"]["uid"]
    run = the_run(mlflow_server.url, tiny.ns, uid)
    tracking = status["result"]["tracking"]
    assert tracking["runId"] == run.info.run_id and tracking["runUrl"].endswith(f"/runs/{run.info.run_id}")
    assert seen_while_running.get("tracking", {}).get("runId") == run.info.run_id  # from rank 0's metrics
    assert run.info.status == "FINISHED"
    assert loss_steps(mlflow_server.url, run.info.run_id) == list(range(1, max_steps + 1))
    params = run.data.params
    assert (params["lora.r"], params["lora.alpha"], params["plan.zero_stage"], params["max_steps"]) == (
        "128",
        "256",
        "2",
        str(max_steps),
    )
    assert int(params["plan.per_gpu_bytes"]) > 0 and params["model"] == "builtin://tiny-llama"
    tags = run.data.tags
    assert (tags["ftjob.job"], tags["ftjob.namespace"], tags["ftjob.image"]) == ("tiny-cpu", tiny.ns, "trainer:test")
    from mlflow.tracking import MlflowClient

    adapter = {a.path for a in MlflowClient(tracking_uri=mlflow_server.url).list_artifacts(run.info.run_id, "adapter")}
    assert "adapter/adapter_model.safetensors" in adapter
    assert tags["ftjob.adapter_uri"] == "pvc://ftjob-output/tiny-cpu/adapter"


def test_a_tracking_server_outage_is_a_warning_and_the_run_gets_every_step(
    tiny: Jobs, kubeconfig: Path, local_cluster: Any, operator: OperatorProcess, tmp_path: Path
) -> None:
    max_steps = 150
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        env = {"FTJOB_TRACKING_FLUSH_SECONDS": "300"}  # a job that ends during the outage waits for the server
        kubectl(kubeconfig, "apply", "-f", "-", stdin=tracked_job(tiny.ns, server.url, max_steps, 2, env))
        tiny.wait(lambda s: bool(((s.get("result") or {}).get("tracking") or {}).get("runId")) and
                  (s.get("progress") or {}).get("step", 0) >= 4, "the run and a few steps", name="tiny-cpu",
                  timeout=600)  # fmt: skip
        server.stop()
        stopped = time.monotonic()
        try:
            tiny.wait_events({"TrackingFailing"}, name="tiny-cpu", timeout=30)
            warning = next(e for e in tiny.events("tiny-cpu") if e["reason"] == "TrackingFailing")
            assert warning["type"] == "Warning" and "training goes on" in warning["message"], warning
            assert tiny.status("tiny-cpu")["state"] == "Running"
            steps_in_outage = (tiny.status("tiny-cpu").get("progress") or {}).get("step", 0)
            time.sleep(max(0.0, 30 - (time.monotonic() - stopped)))  # the outage lasts 30 s
        finally:
            server.start()
        status = tiny.wait_state("Succeeded", name="tiny-cpu", timeout=600)
        uid = tiny.get("tiny-cpu")["metadata"]["uid"]
        run = the_run(server.url, tiny.ns, uid)
        assert loss_steps(server.url, run.info.run_id) == list(range(1, max_steps + 1)), steps_in_outage
        assert status["result"]["tracking"]["runId"] == run.info.run_id
        assert "unpublishedRecords" not in status["result"]["tracking"]
        assert run.info.status == "FINISHED"
        journal = output_dir(local_cluster, tiny.ns) / "tracking" / "records.jsonl"
        assert journal.is_file()
    finally:
        server.stop()
