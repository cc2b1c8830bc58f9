"""End to end on object storage: a 2-node job with no claim at all, through the process node.

The S3 server is SeaweedFS on loopback. The job reads its model (the demo's tiny Llama, put in
the bucket) and its data from it, stages checkpoints on each pod's scratch emptyDir and commits
them to the bucket. Both ranks are SIGKILLed twice: two steps after the first checkpoint was
committed, and then in the middle of the second checkpoint's upload (after its first file). Each
restarted gang resumes from the newest committed checkpoint (the half-uploaded one does not
exist and is deleted) and the job Succeeds, leaving the committed checkpoints, the adapter and
the completion record under the job's prefix, with an adapter equal (within ADAPTER_ATOL) to
that of an uninterrupted `ftjob run` of the same job (the same world size, data and seeds), run
on this machine meanwhile. The keys reach the pods only through secretKeyRef: they appear in no
object of the bucket, no pod spec, Event or status, and not in the operator's log.

A second job meets the S3 server stopped for OUTAGE_S seconds in the middle of a checkpoint
upload: its ranks retry under `spec.objectStorage.retryTimeoutSeconds`, the upload completes
when the server is back, and the job Succeeds without a restart, every checkpoint committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, kubectl
from finetune_localcluster.ports import free_port
from finetune_localcluster.s3server import S3Server
from tests.cluster.operator_harness import Jobs
from tests.cluster.process_jobs import assert_same_adapter, tiny_job, worker_pids
from tests.support.s3 import (
    BUCKET,
    checkpoint_folders,
    committed_steps,
    download_folder,
    job_storage,
    key_env,
    keys,
    running_s3,
    upload_folder,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_STEPS, CHECKPOINT_EVERY, KILL_AT = 12, 4, 6
SECOND = 2 * CHECKPOINT_EVERY
"""The checkpoint whose upload is cut (by a kill in the first test, an outage in the second)."""
OUTAGE_S = 60
SECRET = "s3-keys"
JOB = "tiny-cpu"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The server, with the demo's tiny Llama and the reverse-words records in the bucket."""
    from finetune_trainer.data import builtin_datasets
    from finetune_trainer.model import builtin_models

    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        client = server.client()
        model = builtin_models.materialise_model(builtin_models.TINY_LLAMA, tmp_path_factory.mktemp("model"), seed=42)
        upload_folder(client, model, "models/tiny-llama")
        data = tmp_path_factory.mktemp("data") / "reverse-words.jsonl"
        data.write_text(
            "".join(json.dumps(r) + "\n" for r in builtin_datasets.builtin_records(builtin_datasets.REVERSE_WORDS))
        )
        client.upload_file(str(data), BUCKET, "data/reverse-words.jsonl")
        yield server


def s3_job(namespace: str, server: S3Server, output: str) -> dict[str, Any]:
    """examples/tiny-cpu.yaml on the process node, with model, data and output in the bucket."""
    doc = tiny_job(namespace, max_steps=MAX_STEPS, checkpoint_every=CHECKPOINT_EVERY)
    spec = doc["spec"]
    spec["model"] = {
        "uri": f"s3://{BUCKET}/models/tiny-llama",
        "architecture": "tiny-llama",  # the catalogue's entry: the operator does not read the bucket
        "cache": {"size": "1Gi"},  # the pods' copy of the model and data (the process node has 100Gi in all)
    }
    spec["dataset"]["uri"] = f"s3://{BUCKET}/data/reverse-words.jsonl"
    spec["output"] = {"uri": f"s3://{BUCKET}/{output}"}
    spec["objectStorage"] = job_storage(server, SECRET)
    spec["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]  # the same kernels as the reference run
    return doc


@pytest.fixture
def reference(s3: S3Server, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """The same job, uninterrupted, through `ftjob run` on this machine (its adapter goes to
    `runs/reference` in the bucket), running in the background while the test runs; its process
    group (the launcher and its ranks) is ended afterwards."""
    tmp = tmp_path / "reference"
    tmp.mkdir()
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(s3_job("default", s3, "runs/reference")))
    env = {**os.environ, **key_env(s3), "OMP_NUM_THREADS": "1", "FTJOB_S3_MIRROR": str(tmp / "cache")}
    argv = [sys.executable, "-m", "finetune_operator.cli.main", "run", str(job), "--no-progress",
            "--master-port", str(free_port())]  # fmt: skip
    run = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        yield run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def reference_adapter(run: subprocess.Popen[str], server: S3Server, tmp: Path) -> Path:
    """Waits for the reference run; the folder holding its downloaded `adapter/`."""
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["adapterUri"] == f"s3://{BUCKET}/runs/reference/adapter" and summary["steps"] == MAX_STEPS
    assert server.secret_key not in out + err
    return download_folder(server.client(), "runs/reference/adapter", tmp / "adapter").parent


def _secrets_seen(kube: Kube, ns: str, operator: OperatorProcess, keys: tuple[str, ...]) -> list[str]:
    """Where any of `keys` appears among what the operator wrote or read back, and its log."""
    places = {
        "configmaps": kube.items(f"/api/v1/namespaces/{ns}/configmaps"),
        "statefulsets": kube.items(f"/apis/apps/v1/namespaces/{ns}/statefulsets"),
        "pods": kube.items(f"/api/v1/namespaces/{ns}/pods"),
        "events": kube.items(f"/api/v1/namespaces/{ns}/events"),
        "job": kube.get(f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs/{JOB}"),
        "operator log": operator.log_path.read_text(errors="replace"),
    }
    return [name for name, value in places.items() for key in keys if key in json.dumps(value)]


def _objects_holding(server: S3Server, secrets: tuple[str, ...]) -> list[str]:
    """Keys of the bucket's objects whose bytes contain any of `secrets`."""
    client, found = server.client(), []
    listed = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
              for item in page.get("Contents", [])]  # fmt: skip
    assert any(key.endswith("/manifest.json") for key in listed), listed  # the listing reaches the checkpoints
    for key in listed:
        body: bytes = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        found += [key for secret in secrets if secret.encode() in body]
    return found


def _job_with_its_secret(kube: Kube, ns: str, s3: S3Server) -> tuple[Jobs, str, dict[str, Any]]:
    """The namespace's keys Secret created; the job's helpers, its output prefix and its document."""
    output = f"runs/{ns}/{JOB}"
    kube.create(f"/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": SECRET}, "stringData": key_env(s3)})
    return Jobs(kube, ns), output, s3_job(ns, s3, output)


def test_two_node_job_on_s3_without_a_claim_resumes_from_its_committed_checkpoint_and_keeps_the_keys_out(
    s3: S3Server,
    reference: subprocess.Popen[str],
    kube: Kube,
    kubeconfig: Path,
    local_cluster: LocalCluster,
    restricted_namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    ns, client = restricted_namespace, s3.client()
    jobs, output, doc = _job_with_its_secret(kube, ns, s3)
    (tmp_path / "once").mkdir()
    doc["spec"]["env"] += [
        # Both ranks, once each: at step 6 (step 4's checkpoint is committed: publish returns after
        # the manifest is put), then after the first file of step 8's upload, before its manifest.
        {"name": "FTJOB_FAULT_KILL", "value": f"step:{KILL_AT},upload:{SECOND}"},
        {"name": "FTJOB_FAULT_ONCE_DIR", "value": str(tmp_path / "once")},  # outlives the pods' scratch
    ]
    doc["spec"]["failurePolicy"] = {"backoffLimit": 3}
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
    try:
        status = jobs.wait_state("Succeeded", name=JOB, timeout=720)
    except BaseException:
        print(jobs.describe(JOB), "\noperator log:", operator.log_tail())
        raise
    assert sorted(p.name for p in (tmp_path / "once").glob(".fault-kill-*")) == sorted(
        f".fault-kill-{point}-rank{rank}" for point in (f"step-{KILL_AT}", f"upload-{SECOND}") for rank in (0, 1)
    )  # both kills fired, on both ranks
    assert status["restarts"] == 2, status.get("lastFailure")
    # after the kill mid-upload too: step 8's half-uploaded folder had no manifest
    assert status["progress"]["resumedFromStep"] == CHECKPOINT_EVERY, status["progress"]
    jobs.wait_events({"ResumedFromCheckpoint", "Completed"}, name=JOB)
    resumed = [e["message"] for e in jobs.events(JOB) if e["reason"] == "ResumedFromCheckpoint"]
    assert [m for m in resumed if f"resumed from the step-{CHECKPOINT_EVERY} checkpoint" in m], resumed
    assert not [m for m in resumed if f"step-{SECOND} checkpoint" in m], resumed
    assert status["result"]["adapterUri"] == f"s3://{BUCKET}/{output}/adapter"
    assert status["result"]["steps"] == MAX_STEPS

    written = keys(client, output)
    assert {"adapter/adapter_model.safetensors", "COMPLETED.json", "train_log.jsonl"} <= set(written), sorted(written)
    # steps 4 and 8 (the last step saves the adapter, not a checkpoint); no uncommitted folder left
    assert committed_steps(client, output) == [CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY], sorted(written)
    assert checkpoint_folders(client, output) == {"step-00000004", "step-00000008"}, sorted(written)
    logged = [json.loads(line) for line in client.get_object(Bucket=BUCKET, Key=f"{output}/train_log.jsonl")[
        "Body"].read().decode().splitlines() if line.strip()]  # fmt: skip
    assert max(r.get("step", 0) for r in logged) == MAX_STEPS

    pod_spec = jobs.statefulset(JOB)["spec"]["template"]["spec"]  # type: ignore[index]
    assert not [v for v in pod_spec["volumes"] if "persistentVolumeClaim" in v]
    trainer_env = {e["name"]: e for c in pod_spec["containers"] for e in c.get("env", [])}
    for name in key_env(s3):
        assert trainer_env[name]["valueFrom"]["secretKeyRef"]["name"] == SECRET, trainer_env[name]
    secrets = (s3.access_key, s3.secret_key)
    assert _secrets_seen(kube, ns, operator, secrets) == []

    want = reference_adapter(reference, s3, tmp_path / "reference" / "out")
    got = download_folder(client, f"{output}/adapter", tmp_path / "got" / "adapter").parent
    assert_same_adapter(got, want, f"killed at step {KILL_AT}, resumed from step {CHECKPOINT_EVERY}")
    assert _objects_holding(s3, secrets) == []  # the job's objects, the reference run's and the inputs


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP), from /proc/PID/stat's state field."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "T"


def test_an_outage_of_the_s3_server_during_a_checkpoint_upload_is_ridden_out_without_losing_a_checkpoint(
    s3: S3Server,
    kube: Kube,
    kubeconfig: Path,
    local_cluster: LocalCluster,
    restricted_namespace: str,
    operator: OperatorProcess,
) -> None:
    ns, client = restricted_namespace, s3.client()
    jobs, output, doc = _job_with_its_secret(kube, ns, s3)
    doc["spec"]["objectStorage"]["retryTimeoutSeconds"] = 5 * OUTAGE_S
    # Each rank stops itself after the first file of step 8's upload, so the outage starts mid-upload.
    doc["spec"]["env"] += [{"name": "FTJOB_FAULT_STOP", "value": f"upload:{SECOND}"}]
    doc["spec"]["failurePolicy"] = {"backoffLimit": 0}  # riding it out means no restart
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))

    def both_stopped() -> list[int] | None:
        """The stopped rank of each pod (its launcher, also listed by worker_pids, keeps running)."""
        stopped = [[pid for pid in worker_pids(f"{JOB}-{index}", ns) if _stopped(pid)] for index in (0, 1)]
        return [pids[0] for pids in stopped] if all(len(pids) == 1 for pids in stopped) else None

    try:
        try:
            pids = wait_for(both_stopped, 480, f"both ranks to stop in the middle of step {SECOND}'s upload")
        except TimeoutError:
            states = {pid: _stopped(pid) for i in (0, 1) for pid in worker_pids(f"{JOB}-{i}", ns)}
            print("ranks (pid: stopped):", states, "\n", jobs.describe(JOB), "\noperator log:", operator.log_tail())
            raise
        assert committed_steps(client, output) == [CHECKPOINT_EVERY]
        s3.stop()
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(OUTAGE_S)  # the ranks' uploads meet a dead endpoint, and retry
        assert not [pid for pid in pids if not Path(f"/proc/{pid}").exists()], "a rank gave up during the outage"
        assert jobs.status(JOB).get("restarts", 0) == 0
    finally:
        if s3.proc is None:
            s3.start()
    try:
        status = jobs.wait_state("Succeeded", name=JOB, timeout=480)
    except BaseException:
        print(jobs.describe(JOB), "\noperator log:", operator.log_tail())
        raise
    assert status.get("restarts", 0) == 0, status.get("lastFailure")
    assert status["result"]["steps"] == MAX_STEPS
    assert committed_steps(client, output) == [CHECKPOINT_EVERY, SECOND]
    assert checkpoint_folders(client, output) == {"step-00000004", "step-00000008"}
