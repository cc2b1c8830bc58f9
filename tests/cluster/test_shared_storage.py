"""A multi-node job on a ReadWriteOnce claim is refused at plan time (issue 13, defect 4).

Against the real apiserver: the operator reads the output claim's access modes through the
API and fails the job `Failed/InvalidSpec`, naming the claim and saying ReadWriteMany is
needed, instead of letting the second pod hang in ContainerCreating (Multi-Attach). The same
job on a ReadWriteMany claim is planned.
"""

from __future__ import annotations

from typing import Any

import pytest

from finetune_localcluster import Kube
from finetune_localcluster.devtools import OperatorProcess
from tests.cluster.operator_harness import Jobs, gpu_job

pytestmark = pytest.mark.timeout(180)


def claim(kube: Kube, namespace: str, name: str, mode: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions", [])}


def test_multi_node_job_on_read_write_once_claim_is_refused(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    jobs = Jobs(kube, namespace)
    claim(kube, namespace, "ckpt-rwo", "ReadWriteOnce")
    jobs.create("rwo", **gpu_job(dataset={"uri": "/data/train.jsonl"}, output={"uri": "pvc://ckpt-rwo/run"}))
    status = jobs.wait(lambda s: "Failed" in conditions(s), "Failed condition", name="rwo", timeout=60)
    failed = conditions(status)["Failed"]
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec", failed
    assert "'ckpt-rwo'" in failed["message"] and "ReadWriteMany" in failed["message"], failed
    statefulset = jobs.statefulset("rwo")
    assert statefulset is None or statefulset["spec"]["replicas"] == 0


def test_multi_node_job_on_read_write_many_claim_is_planned(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    jobs = Jobs(kube, namespace)
    claim(kube, namespace, "ckpt-rwx", "ReadWriteMany")
    jobs.create("rwx", **gpu_job(dataset={"uri": "/data/train.jsonl"}, output={"uri": "pvc://ckpt-rwx/run"}))
    status = jobs.wait(lambda s: "Planned" in conditions(s), "Planned condition", name="rwx", timeout=60)
    assert conditions(status)["Planned"]["status"] == "True", status
    assert "Failed" not in conditions(status) or conditions(status)["Failed"]["status"] != "True"


def test_gpu_placement_schedules_on_nodes_with_the_gfd_memory_label(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    """The rendered nvidia.com/gpu.memory affinity, GPU toleration and model-cache request fit the kwok
    GPU nodes (labelled like GPU Feature Discovery does) for the real scheduler; a 141Gi card does not."""
    jobs = Jobs(kube, namespace)
    jobs.create("fits", **gpu_job(dataset={"uri": "/data/train.jsonl"}, output={"uri": "/output/job"}))
    jobs.wait_state("Running", "fits", timeout=90)
    big = {"gpuMemory": "141Gi"}
    jobs.create(
        "too-big", **gpu_job(resources=big, dataset={"uri": "/data/train.jsonl"}, output={"uri": "/output/job"})
    )
    status = jobs.wait(
        lambda s: (
            "nvidia.com/gpu.memory" in conditions(s).get("Running", {}).get("message", "")
            or "node affinity" in conditions(s).get("Running", {}).get("message", "")
        ),
        "an unschedulable reason",
        name="too-big",
        timeout=60,
    )
    assert conditions(status)["Running"]["status"] == "False", status


def test_the_newest_warning_event_of_a_pod_is_read_by_its_uid(kube: Kube, namespace: str, k8s_client: Any) -> None:
    """KubernetesClusterIO.pod_warning against the real apiserver: field selectors on the pod's uid and
    `type=Warning`, the newest first; another pod's events and Normal events are not read."""
    from finetune_operator.reconcile.cluster_io import KubernetesClusterIO

    def make_pod(name: str) -> dict[str, Any]:
        spec = {"containers": [{"name": "c", "image": "x"}], "nodeName": "nowhere"}
        return kube.create(f"/api/v1/namespaces/{namespace}/pods", {"metadata": {"name": name}, "spec": spec})

    def event(pod: dict[str, Any], name: str, kind: str, reason: str, message: str, at: str) -> None:
        meta = pod["metadata"]
        obj = {"kind": "Pod", "namespace": namespace, "name": meta["name"], "uid": meta["uid"], "apiVersion": "v1"}
        kube.create(
            f"/api/v1/namespaces/{namespace}/events",
            {"metadata": {"name": name}, "involvedObject": obj, "type": kind, "reason": reason, "message": message,
             "firstTimestamp": at, "lastTimestamp": at, "source": {"component": "attachdetach-controller"}},
        )  # fmt: skip

    stuck, other = make_pod("job-1"), make_pod("job-0")
    io = KubernetesClusterIO(k8s_client)
    assert io.pod_warning(namespace, stuck["metadata"]["uid"]) is None
    event(stuck, "e1", "Warning", "FailedMount", "timed out waiting for the condition", "2026-12-01T08:00:00Z")
    event(stuck, "e2", "Warning", "FailedAttachVolume", 'Multi-Attach error for volume "pvc-1"', "2026-12-01T08:00:05Z")
    event(stuck, "e3", "Normal", "Scheduled", "assigned", "2026-12-01T08:00:09Z")
    event(other, "e4", "Warning", "BackOff", "not this pod", "2026-12-01T08:00:10Z")
    assert io.pod_warning(namespace, stuck["metadata"]["uid"]) == (
        'FailedAttachVolume: Multi-Attach error for volume "pvc-1"'
    )
    # Bound to a node that does not exist, no kubelet confirms their deletion: only the pod
    # garbage collector would remove them (~40 s quarantine, longer under load). Force them.
    for pod in (stuck, other):
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})
