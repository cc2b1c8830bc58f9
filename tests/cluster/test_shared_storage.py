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
    assert jobs.statefulset("rwo") is None or jobs.statefulset("rwo")["spec"]["replicas"] == 0


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
