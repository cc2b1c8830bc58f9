"""The operator's lifecycle against the real control plane and kwok GPU nodes.

Each test applies a FineTuneJob, lets the real operator, StatefulSet controller,
scheduler and garbage collector act, and plays only the kubelet's part: reporting
container exits on the simulated pods.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from finetune_localcluster import Kube, KubeError, wait_for
from finetune_localcluster.devtools import OperatorProcess
from tests.cluster.operator_harness import Jobs, gpu_job, small

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def jobs(kube: Kube, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(kube, namespace)


def running(jobs: Jobs, name: str = "job") -> dict[str, Any]:
    return jobs.wait_state("Running", name)


def uids(jobs: Jobs, name: str = "job") -> set[str]:
    return {p["metadata"]["uid"] for p in jobs.pods(name)}


def test_a_job_gets_its_children_and_runs(jobs: Jobs) -> None:
    created = jobs.create(**small())
    status = running(jobs)
    assert "workers" in status, status
    assert status["workers"] == {"ready": 2, "total": 2, "summary": "2/2"}
    assert status["topology"] == "2×4"
    assert status["plan"]["zeroStage"] in (0, 1, 2, 3)
    assert {c["type"]: c["status"] for c in status["conditions"]}["Planned"] == "True"
    sts = jobs.statefulset()
    assert sts is not None and sts["spec"]["replicas"] == 2
    owner = sts["metadata"]["ownerReferences"][0]
    assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] is True
    cm = jobs.kube.get(f"/api/v1/namespaces/{jobs.ns}/configmaps/job-config")
    assert cm["data"]["hostfile"].splitlines() == [
        f"job-0.job-workers.{jobs.ns}.svc slots=4",
        f"job-1.job-workers.{jobs.ns}.svc slots=4",
    ]
    svc = jobs.kube.get(f"/api/v1/namespaces/{jobs.ns}/services/job-workers")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    jobs.wait_events({"Planned", "AllRanksRunning"})


def test_every_rank_exiting_zero_succeeds_and_frees_the_gpus(jobs: Jobs) -> None:
    jobs.create(**small())
    running(jobs)
    summary = {"finalLoss": 0.42, "steps": 10, "tokens": 5000, "adapterUri": "/mnt/pvc/out/job/adapter"}
    for pod in jobs.pods():
        jobs.report(pod["metadata"]["name"], {"exitCode": 0, "reason": "Completed", "message": json.dumps(summary)},
                    last=True, restarts=1)  # fmt: skip
    status = jobs.wait_state("Succeeded")
    assert status["result"]["finalLoss"] == 0.42 and status["result"]["adapterUri"] == "/mnt/pvc/out/job/adapter"
    assert status["completionTime"]
    wait_for(lambda: (s := jobs.statefulset()) and s["spec"]["replicas"] == 0, 30, "scale to 0")


def test_rank_failure_restarts_the_whole_gang_then_fails_past_the_budget(jobs: Jobs) -> None:
    jobs.create(**small(failurePolicy={"backoffLimit": 1}))
    running(jobs)
    first = uids(jobs)
    jobs.report("job-1", {"exitCode": 1, "message": "RuntimeError: NCCL communicator was aborted"})
    status = jobs.wait(lambda s: s.get("restarts") == 1, "one gang restart")
    assert "NCCL" in status["lastFailure"]["message"] and status["lastFailure"]["rank"] == 1
    wait_for(lambda: len(uids(jobs)) == 2 and not (uids(jobs) & first), 60, "a whole new gang")
    running(jobs)
    jobs.report("job-0", {"exitCode": 2, "message": "ValueError: broken batch"})
    status = jobs.wait_state("Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "broken batch" in failed["message"]
    assert status["restarts"] == 1
    wait_for(lambda: (s := jobs.statefulset()) and s["spec"]["replicas"] == 0, 30, "scale to 0")
    jobs.wait_events({"RankFailed", "BackoffLimitExceeded"})


def test_a_malformed_dataset_fails_at_once_without_a_gang_restart(jobs: Jobs) -> None:
    jobs.create(**small(failurePolicy={"backoffLimit": 3}))
    running(jobs)
    first = uids(jobs)
    line = "DataError: /data/train.jsonl:7: malformed alpaca record: missing field 'output' (rank 8)"
    jobs.report("job-1", {"exitCode": 1, "message": line})
    status = jobs.wait_state("Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DataError" and "train.jsonl:7" in failed["message"], failed
    assert status["restarts"] == 0 and status["lastFailure"]["rank"] == 1
    wait_for(lambda: (s := jobs.statefulset()) and s["spec"]["replicas"] == 0, 30, "scale to 0")
    jobs.wait_events({"DataError"})
    assert not (uids(jobs) - first), "no new gang was started"


def test_out_of_memory_replans_and_restarts(jobs: Jobs) -> None:
    jobs.create(**small())
    before = running(jobs)["plan"]
    old_hash = jobs.pods()[0]["metadata"]["annotations"]["finetune.dev/config-hash"]
    jobs.report("job-0", {"exitCode": 137, "reason": "OOMKilled"})
    status = jobs.wait(lambda s: s["plan"].get("replans") == 1, "a re-plan")
    assert status["plan"] != before and "OOMKilled" in status["plan"]["replanReason"]
    wait_for(
        lambda: (
            (pods := jobs.pods())
            and all(p["metadata"]["annotations"]["finetune.dev/config-hash"] != old_hash for p in pods)
            and len(pods) == 2
        ),
        60,
        "pods rendered from the new plan",
    )
    deepspeed = json.loads(jobs.kube.get(f"/api/v1/namespaces/{jobs.ns}/configmaps/job-config")["data"]["plan.json"])
    assert deepspeed["replans"] == 1
    jobs.wait_events({"OutOfMemoryReplanned"})


def test_suspend_scales_to_zero_and_resume_scales_back(jobs: Jobs) -> None:
    jobs.create(**small())
    running(jobs)
    jobs.patch("job", {"suspend": True})
    jobs.wait_state("Suspended")
    wait_for(lambda: not jobs.pods(), 60, "pods gone while suspended")
    jobs.patch("job", {"suspend": False})
    running(jobs)
    assert len(jobs.pods()) == 2


def test_active_deadline_fails_the_job(jobs: Jobs) -> None:
    jobs.create(**small(activeDeadlineSeconds=3))
    status = jobs.wait_state("Failed", timeout=60)
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"


def test_ttl_deletes_a_finished_job_and_its_children(jobs: Jobs) -> None:
    jobs.create(**small(ttlSecondsAfterFinished=2, activeDeadlineSeconds=1))
    jobs.wait_state("Failed")
    wait_for(lambda: jobs.kube.get_or_none(f"/apis/finetune.dev/v1alpha1/namespaces/{jobs.ns}/finetunejobs/job")
             is None, 60, "the job to be deleted by its TTL")  # fmt: skip
    assert wait_for(lambda: jobs.statefulset() is None, 60, "the StatefulSet garbage-collected")
    config = f"/api/v1/namespaces/{jobs.ns}/configmaps/job-config"
    assert wait_for(lambda: jobs.kube.get_or_none(config) is None, 60, "the ConfigMap garbage-collected")


def test_deleting_a_job_collects_children_but_keeps_output(jobs: Jobs) -> None:
    # ReadWriteMany: a 2-node job's ranks all write its checkpoints (a ReadWriteOnce claim is refused)
    pvc = {"metadata": {"name": "out"}, "spec": {"accessModes": ["ReadWriteMany"],
                                                  "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    jobs.kube.create(f"/api/v1/namespaces/{jobs.ns}/persistentvolumeclaims", pvc)
    jobs.create(**small(output={"uri": "pvc://out/job"}))
    wait_for(lambda: jobs.statefulset() is not None, 30, "the StatefulSet")
    jobs.kube.delete(f"/apis/finetune.dev/v1alpha1/namespaces/{jobs.ns}/finetunejobs/job")
    wait_for(lambda: jobs.statefulset() is None, 60, "the StatefulSet to be collected")
    wait_for(lambda: jobs.kube.get_or_none(f"/api/v1/namespaces/{jobs.ns}/configmaps/job-config") is None, 60,
             "the ConfigMap to be collected")  # fmt: skip
    assert jobs.kube.get_or_none(f"/api/v1/namespaces/{jobs.ns}/persistentvolumeclaims/out") is not None


def test_mutable_change_rolls_the_gang(jobs: Jobs) -> None:
    jobs.create(**small())
    running(jobs)
    first = uids(jobs)
    jobs.patch("job", {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]})

    def rolled() -> bool:
        # the StatefulSet controller may recreate one gang from a cached older template first;
        # the operator restarts that one too, until every pod runs the new template
        pods = jobs.pods()
        new_env = {"name": "NCCL_DEBUG", "value": "INFO"}
        return len(pods) == 2 and all(new_env in p["spec"]["containers"][0]["env"] for p in pods)

    wait_for(rolled, 90, "a new gang with the new env")
    assert not (uids(jobs) & first)
    assert jobs.status()["restarts"] == 0


def test_operator_restart_keeps_counts_and_children(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(**small())
    running(jobs)
    jobs.report("job-0", {"exitCode": 1, "message": "boom"})
    jobs.wait(lambda s: s.get("restarts") == 1, "one restart")
    operator.stop()
    operator.start()
    status = running(jobs)
    assert status["restarts"] == 1
    kinds = {
        "statefulsets": f"/apis/apps/v1/namespaces/{jobs.ns}/statefulsets",
        "services": f"/api/v1/namespaces/{jobs.ns}/services",
        "configmaps": f"/api/v1/namespaces/{jobs.ns}/configmaps",
    }
    for kind, path in kinds.items():
        owned = [o for o in jobs.kube.items(path) if o["metadata"].get("labels", {}).get("finetune.dev/job-name")]
        assert len(owned) == 1, kind


def test_deeper_validation_fails_the_job_with_a_reason(jobs: Jobs) -> None:
    jobs.create(**small(deepspeed={"overrides": {"train_batch_size": 64}}))
    status = jobs.wait_state("Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.deepspeed.overrides" in failed["message"]
    assert jobs.statefulset() is None


@pytest.mark.parametrize("depth", [1000, 5000])
def test_a_deeply_nested_override_fails_its_job_and_never_the_operator(
    jobs: Jobs, operator: OperatorProcess, depth: int
) -> None:
    """The apiserver keeps unknown fields under overrides (its CEL cannot type them), so a value
    nested 1,000 deep was admitted and stopped kopf's watch with RecursionError, for every job."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(4 * depth + limit)  # this test's own client copies, encodes and decodes the body
    try:
        jobs.create("deep", **small(deepspeed={"overrides": {"zero_optimization.x": value}}))
        status = jobs.wait_state("Failed", name="deep")
    finally:
        sys.setrecursionlimit(limit)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.deepspeed.overrides" in failed["message"], failed
    assert operator.proc is not None and operator.proc.poll() is None, operator.log_path.read_text()[-3000:]
    jobs.create(**small())
    running(jobs)  # the watch is still alive: a later job is planned and started


def test_unschedulable_workers_say_why(jobs: Jobs) -> None:
    jobs.create(**small(dataset={"uri": "pvc://missing-claim/train.jsonl"}))
    status = jobs.wait(
        lambda s: any("missing-claim" in c.get("message", "") for c in s.get("conditions", [])),
        "the scheduler's reason in a condition",
    )
    assert status["state"] == "Planned"


def test_unknown_model_is_invalid_spec(jobs: Jobs) -> None:
    jobs.create(**small(model={"uri": "nobody/NoSuchModel-3B"}))
    status = jobs.wait_state("Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "NoSuchModel" in failed["message"]


def test_a_job_that_cannot_fit_says_what_would(jobs: Jobs) -> None:
    resources = {"numNodes": 1, "gpusPerNode": 1, "gpuMemory": "24Gi", "memory": "64Gi"}
    jobs.create(**gpu_job(model={"uri": "meta-llama/Llama-3.1-70B"}, method={"type": "full"}, resources=resources))
    status = jobs.wait_state("Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DoesNotFit"
    assert "qlora" in failed["message"] and "more GPUs" in failed["message"]


def test_nonsense_status_does_not_crash_the_operator(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(**small())
    running(jobs)
    path = f"/apis/finetune.dev/v1alpha1/namespaces/{jobs.ns}/finetunejobs/job/status"
    jobs.kube.merge_patch(path, {"status": {"conditions": [{"type": "Weird", "status": "True", "reason": "Because",
                                                            "lastTransitionTime": "2020-01-01T00:00:00Z"}],
                                            "plan": None, "restarts": 7}})  # fmt: skip
    status = jobs.wait(lambda s: s.get("plan") is not None and s.get("state") == "Running", "a repaired status")
    assert status["restarts"] == 7
    assert operator.proc is not None and operator.proc.poll() is None


def test_operator_metrics_are_exported(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(**small())
    running(jobs)
    text = operator.metrics()
    for name in (
        "finetune_operator_reconcile_total",
        "finetune_operator_reconcile_time_seconds_bucket",
        "finetune_operator_jobs",
        "finetune_operator_build_info",
        "finetune_operator_active_workers",
    ):
        assert name in text, name
    assert 'finetune_operator_reconcile_total{controller="finetunejob",result="success"}' in text


def test_apiserver_rejects_what_the_crd_forbids(jobs: Jobs) -> None:
    with pytest.raises(KubeError) as info:
        jobs.create(**small(deepspeed={"zeroStage": 1, "offloadParams": "cpu"}))
    assert "offloadParams" in str(info.value)
