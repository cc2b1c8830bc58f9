"""Queues and quotas with the real, Go-built Kueue: admission is all or nothing, a job waits
`Queued` with Kueue's own reason, and quota comes back when a job ends or is deleted.

This module starts its own cluster (kwok GPU nodes, Kueue with its webhooks) and its own
operator with `--kueue`; it plays only the kubelet's part, reporting container exits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster import Kube, KubeError, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, helm, install_crd, service_account_kubeconfig
from tests.cluster.operator_harness import JOBS, Jobs, gpu_job
from tests.factories import job_document

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
FLAVOR_LABELS = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
CHART = Path(__file__).resolve().parents[2] / "charts" / "finetune-operator"
SYSTEM = "ftjob-system"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(gpu_nodes=2, process_nodes=0, kueue=True) as c:
        yield c


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Iterator[Kube]:
    client = cluster.kube()
    yield client
    client.close()


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator with the credentials of the chart's service account (`kueue.enabled=true`), so
    every scenario also checks that the chart grants what the Kueue integration uses."""
    tmp = tmp_path_factory.mktemp("operator")
    kube.create("/api/v1/namespaces", {"metadata": {"name": SYSTEM}})
    helm(cluster.kubeconfig, "install", "ftjob", str(CHART), "--namespace", SYSTEM, "--wait=false",
         "--set", "kueue.enabled=true")  # fmt: skip
    install_crd(kube)
    deployment = kube.get(f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/ftjob-finetune-operator")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    config = service_account_kubeconfig(kube, cluster, SYSTEM, account, tmp / "sa.kubeconfig")
    kube.create(
        f"{KUEUE}/resourceflavors",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "a100"},
         "spec": {"nodeLabels": FLAVOR_LABELS}},
    )  # fmt: skip
    log: Path = tmp / "operator.log"
    process = OperatorProcess(config, log, extra_args=("--kueue",))
    process.start()
    yield process
    process.stop()
    log = process.log_tail(5000)
    # an RBAC denial reads '... is forbidden: User "system:serviceaccount:..." cannot ...' (a namespace
    # being deleted also answers "forbidden", without a user): the chart's Role must cover every call
    assert "forbidden: user" not in log.lower(), log


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "kq-" + "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[5:40].strip("-")
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")
    kube.delete(f"{KUEUE}/clusterqueues/{name}")


def queue(kube: Kube, namespace: str, gpus: int, preemption: bool = False) -> None:
    """A ClusterQueue with `gpus` GPUs of flavor a100 (CPU, memory, disk plenty) and its LocalQueue `team`."""
    plenty = {"cpu": "1000", "memory": "100Ti", "ephemeral-storage": "100Ti"}
    resources = [{"name": "nvidia.com/gpu", "nominalQuota": gpus}, *({"name": k, "nominalQuota": v}
                 for k, v in plenty.items())]  # fmt: skip
    kube.create(
        f"{KUEUE}/clusterqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": namespace},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                  "resourceGroups": [{"coveredResources": [r["name"] for r in resources],
                                      "flavors": [{"name": "a100", "resources": resources}]}],
                  **({"preemption": {"withinClusterQueue": "LowerPriority"}} if preemption else {})}},
    )  # fmt: skip
    kube.create(
        f"{KUEUE}/namespaces/{namespace}/localqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team"},
         "spec": {"clusterQueue": namespace}},
    )  # fmt: skip


@pytest.fixture
def jobs(kube: Kube, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(kube, namespace)


def queued(nodes: int = 1, **spec: Any) -> dict[str, Any]:
    spec.setdefault("dataset", {"uri": "/data/train.jsonl"})
    spec.setdefault("output", {"uri": "/output/job"})
    return gpu_job(queueName="team", resources={"numNodes": nodes, "gpusPerNode": 8}, **spec)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def workload(jobs: Jobs, name: str) -> dict[str, Any] | None:
    return jobs.kube.get_or_none(f"{KUEUE}/namespaces/{jobs.ns}/workloads/{name}")


def succeed(jobs: Jobs, name: str) -> None:
    summary = json.dumps({"finalLoss": 0.5, "steps": 3, "tokens": 100})
    for pod in jobs.pods(name):
        jobs.report(pod["metadata"]["name"], {"exitCode": 0, "reason": "Completed", "message": summary})


def test_over_quota_job_waits_queued_until_the_first_one_succeeds(jobs: Jobs, kube: Kube, namespace: str) -> None:
    queue(kube, namespace, gpus=8)
    jobs.create("first", **queued())
    jobs.wait_state("Running", "first")
    jobs.create("second", **queued())
    status = jobs.wait(lambda s: condition(s, "Queued").get("reason") == "Pending", "second Pending", "second")
    assert status["state"] == "Queued"
    assert "insufficient" in condition(status, "Queued")["message"], status
    assert not jobs.pods("second"), "a queued job has no pods"
    first_pods = jobs.pods("first")
    assert first_pods and all(p["spec"]["nodeSelector"].items() >= FLAVOR_LABELS.items() for p in first_pods)
    assert condition(jobs.status("first"), "Queued")["reason"] == "Admitted"

    succeed(jobs, "first")
    jobs.wait_state("Succeeded", "first")
    wait_for(
        lambda: (
            (w := workload(jobs, "first"))
            and any(c["type"] == "Finished" and c["status"] == "True" for c in w["status"]["conditions"])
        ),
        30,
        "first Finished",
    )
    jobs.wait_state("Running", "second")
    assert jobs.status("second")["restarts"] == 0


def test_a_quota_smaller_than_the_job_leaves_it_queued_and_says_so(jobs: Jobs, kube: Kube, namespace: str) -> None:
    queue(kube, namespace, gpus=8)
    jobs.create("big", **queued(nodes=2))
    status = jobs.wait(lambda s: "nvidia.com/gpu" in condition(s, "Queued").get("message", ""), "why", "big")
    assert status["state"] == "Queued" and condition(status, "Queued")["status"] == "True"
    assert "maximum capacity" in condition(status, "Queued")["message"], status  # not "wait for others"
    assert not jobs.pods("big")
    sts = jobs.statefulset("big")
    assert sts is None or sts["spec"]["replicas"] == 0


def test_deleting_a_queued_job_leaves_no_workload(jobs: Jobs, kube: Kube, namespace: str) -> None:
    queue(kube, namespace, gpus=0)
    jobs.create("doomed", **queued())
    jobs.wait_state("Queued", "doomed")
    assert workload(jobs, "doomed") is not None
    kube.delete(f"/apis/finetune.dev/v1alpha1/namespaces/{namespace}/finetunejobs/doomed")
    wait_for(lambda: workload(jobs, "doomed") is None, 30, "the Workload to be garbage-collected")


def test_resizing_a_queued_job_replaces_its_workload(jobs: Jobs, kube: Kube, namespace: str) -> None:
    queue(kube, namespace, gpus=0)
    jobs.create("grow", **queued())
    jobs.wait_state("Queued", "grow")
    first = wait_for(lambda: workload(jobs, "grow"), 30, "its Workload")
    assert first["spec"]["podSets"][0]["count"] == 1
    jobs.patch("grow", {"resources": {"numNodes": 2}})

    def replaced() -> dict[str, Any] | None:
        new = workload(jobs, "grow")
        return new if new and new["metadata"]["uid"] != first["metadata"]["uid"] else None

    assert wait_for(replaced, 30, "a new Workload")["spec"]["podSets"][0]["count"] == 2
    assert jobs.status("grow")["state"] == "Queued" and not jobs.pods("grow")


def test_suspending_an_admitted_job_frees_its_quota(jobs: Jobs, kube: Kube, namespace: str) -> None:
    queue(kube, namespace, gpus=8)
    jobs.create("paused", **queued())
    jobs.wait_state("Running", "paused")
    jobs.create("next", **queued())
    jobs.wait_state("Queued", "next")
    jobs.patch("paused", {"suspend": True})
    jobs.wait_state("Suspended", "paused")
    jobs.wait_state("Running", "next")
    assert workload(jobs, "paused") is None
    jobs.patch("paused", {"suspend": False})
    jobs.wait(lambda s: condition(s, "Queued").get("reason") == "Pending", "paused queued again", "paused")


def test_a_higher_priority_job_preempts_a_running_one_without_spending_its_restarts(
    jobs: Jobs, kube: Kube, namespace: str
) -> None:
    queue(kube, namespace, gpus=8, preemption=True)
    for name, value in (("low", 10), ("high", 1000)):
        kube.create(
            f"{KUEUE}/workloadpriorityclasses",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": f"{namespace}-{name}"}, "value": value},
        )  # fmt: skip

    def create(name: str) -> None:
        doc = job_document(**queued())
        labels = {"kueue.x-k8s.io/priority-class": f"{namespace}-{name}"}
        doc["metadata"] = {"name": name, "namespace": namespace, "labels": labels}
        kube.create(JOBS.format(ns=namespace), doc)

    create("low")
    jobs.wait_state("Running", "low")
    create("high")
    low = jobs.wait(lambda s: condition(s, "Queued").get("reason") == "Preempted", "low preempted", "low")
    assert low["state"] == "Queued" and low["evictions"] == 1 and low["restarts"] == 0, low
    jobs.wait_events({"Preempted"}, "low")
    jobs.wait_state("Running", "high")
    assert not jobs.pods("low")

    succeed(jobs, "high")
    jobs.wait_state("Succeeded", "high")
    again = jobs.wait_state("Running", "low")
    assert again["evictions"] == 1 and again["restarts"] == 0, again
    try:
        kube.delete(f"{KUEUE}/workloadpriorityclasses/{namespace}-low")
        kube.delete(f"{KUEUE}/workloadpriorityclasses/{namespace}-high")
    except KubeError:
        pass
