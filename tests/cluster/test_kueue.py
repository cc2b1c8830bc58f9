"""Queues and quotas with the real, Go-built Kueue: admission is all or nothing, a job waits
`Queued` with Kueue's own reason, quota comes back when a job ends or is deleted, and a
preempted job resumes from its checkpoint when it is admitted again.

This module starts its own cluster (kwok GPU nodes, a process node, Kueue with its webhooks)
and its own operator with `--kueue`. On the kwok nodes it plays the kubelet's part, reporting
container exits; on the process node real ranks train (the preemption-and-resume scenario).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster import PROCESS_NODE_LABEL, Kube, KubeError, LocalCluster, wait_for
from finetune_localcluster.devtools import (
    OperatorProcess,
    bind_claim,
    helm,
    install_crd,
    kubectl,
    service_account_kubeconfig,
)
from tests.cluster.operator_harness import JOBS, Jobs, gpu_job
from tests.cluster.process_jobs import CLAIM, tiny_job, worker_pids
from tests.factories import job_document

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TRAINING_WAIT_S = 900
"""How long a wait on a gang's training may take (a checkpoint, a resume, success). A rank gets
what CPU the machine has left: in a CI run of 2026-12-04 (four lanes on 2 cores) low's first
checkpoint had not come after 480 s; in local runs of the same suite the whole test took
572–661 s, against the 900 s it had then."""

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
FLAVOR_LABELS = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
CHART = Path(__file__).resolve().parents[2] / "charts" / "finetune-operator"
SYSTEM = "ftjob-system"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(gpu_nodes=2, process_nodes=1, kueue=True) as c:
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
    for flavor, labels in (("a100", FLAVOR_LABELS), ("process", {PROCESS_NODE_LABEL: "true"})):
        kube.create(
            f"{KUEUE}/resourceflavors",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
             "spec": {"nodeLabels": labels}},
        )  # fmt: skip
    log: Path = tmp / "operator.log"
    process = OperatorProcess(config, log, extra_args=("--kueue",))
    process.start()
    yield process
    process.stop()
    tail = process.log_tail(5000)
    # an RBAC denial reads '... is forbidden: User "system:serviceaccount:..." cannot ...' (a namespace
    # being deleted also answers "forbidden", without a user): the chart's Role must cover every call
    assert "forbidden: user" not in tail.lower(), tail


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "kq-" + "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[5:40].strip("-")
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")
    kube.delete(f"{KUEUE}/clusterqueues/{name}")


def queue(
    kube: Kube, namespace: str, gpus: int, preemption: bool = False, flavor: str = "a100", memory: str = "100Ti"
) -> None:
    """A ClusterQueue with `gpus` GPUs and `memory` of `flavor` (CPU, disk plenty) and its LocalQueue `team`."""
    plenty: dict[str, str | int] = {"cpu": "1000", "memory": memory, "ephemeral-storage": "100Ti"}
    resources: list[dict[str, str | int]] = [{"name": "nvidia.com/gpu", "nominalQuota": gpus},
                                             *({"name": k, "nominalQuota": v} for k, v in plenty.items())]  # fmt: skip
    kube.create(
        f"{KUEUE}/clusterqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": namespace},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                  "resourceGroups": [{"coveredResources": [r["name"] for r in resources],
                                      "flavors": [{"name": flavor, "resources": resources}]}],
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


@pytest.fixture
def priorities(kube: Kube, namespace: str) -> Iterator[dict[str, str]]:
    """WorkloadPriorityClasses `low` (10) and `high` (1000): the label that puts a job in each."""
    names = {level: f"{namespace}-{level}" for level in ("low", "high")}
    for level, value in (("low", 10), ("high", 1000)):
        kube.create(
            f"{KUEUE}/workloadpriorityclasses",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": names[level]}, "value": value},
        )  # fmt: skip
    yield {level: name for level, name in names.items()}
    for name in names.values():
        with contextlib.suppress(KubeError):
            kube.delete(f"{KUEUE}/workloadpriorityclasses/{name}")


def prioritised(doc: dict[str, Any], name: str, namespace: str, priority_class: str) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/priority-class": priority_class}
    return {**doc, "metadata": {"name": name, "namespace": namespace, "labels": labels}}


def test_a_higher_priority_job_preempts_a_running_one_without_spending_its_restarts(
    jobs: Jobs, kube: Kube, namespace: str, priorities: dict[str, str]
) -> None:
    queue(kube, namespace, gpus=8, preemption=True)

    def create(name: str) -> None:
        kube.create(JOBS.format(ns=namespace), prioritised(job_document(**queued()), name, namespace, priorities[name]))

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


def states(cluster: LocalCluster, namespace: str) -> dict[str, str]:
    """The STATUS column of `kubectl get ftj`, by job name."""
    rows = kubectl(cluster.kubeconfig, "get", "ftj", "-n", namespace, "--no-headers").splitlines()
    return {row.split()[0]: row.split()[1] for row in rows if row.strip()}


def logged_steps(train_log: Path) -> list[int]:
    """The optimizer steps the trainer logged, in order, over every run of the ranks."""
    entries = (json.loads(line) for line in train_log.read_text().splitlines())
    return [e["step"] for e in entries if "loss" in e]  # the others are evaluations


def last_step(train_log: Path) -> int:
    """The newest step the running trainer logged (0 before any; a line being written is skipped)."""
    if not train_log.exists():
        return 0
    steps = [0]
    for line in train_log.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            entry = json.loads(line)
            if "loss" in entry:
                steps.append(int(entry["step"]))
    return max(steps)


def pod_memory_request(doc: dict[str, Any]) -> int:
    """Bytes of memory a 1-pod gang of `doc` requests: the host memory the real planner plans."""
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import choose_plan

    doc["spec"]["resources"]["numNodes"] = 1
    return choose_plan(FineTuneJob.from_manifest(doc).spec).host_bytes_per_node


@pytest.mark.e2e
@pytest.mark.timeout(2400)  # three gangs start one after another; see TRAINING_WAIT_S
def test_a_preempted_job_resumes_from_its_checkpoint_with_real_ranks(
    jobs: Jobs, kube: Kube, namespace: str, priorities: dict[str, str], cluster: LocalCluster
) -> None:
    """Scenario 2 through the process node: a low-priority job checkpoints, trains past that
    checkpoint, is preempted (its ranks stopped, not a failure: they save the step where SIGTERM
    arrived), waits while the high-priority one trains, and is admitted again: its trainer
    resumes from the step where it was stopped (0 steps lost) and ends at maxSteps."""
    max_steps, every = 10, 4
    # room for one 1-pod job's memory request, not two (a fixed 3Gi stopped fitting one when the
    # plan's host memory grew past it, and low then waited Queued for ever)
    request = pod_memory_request(tiny_job(namespace, max_steps=max_steps, checkpoint_every=every))
    queue(kube, namespace, gpus=0, preemption=True, flavor="process", memory=f"{request * 3 // 2 // 2**20}Mi")
    bind_claim(kube, namespace, CLAIM)

    def create(name: str, steps: int, checkpoint_every: int) -> None:
        doc = tiny_job(namespace, max_steps=steps, checkpoint_every=checkpoint_every)
        doc["spec"]["resources"]["numNodes"] = 1
        doc["spec"].update(queueName="team", output={"uri": f"pvc://{CLAIM}/{name}"})
        kube.create(JOBS.format(ns=namespace), prioritised(doc, name, namespace, priorities[name]))

    out = cluster.workdir / "pvc" / namespace / CLAIM / "low"
    create("low", max_steps, every)
    jobs.wait_state("Running", "low", timeout=300)
    assert states(cluster, namespace) == {"low": "Running"}
    ranks = wait_for(lambda: worker_pids("low-0", namespace), 240, "the rank of pod low-0")
    wait_for(lambda: any((out / "checkpoints").glob("step-*")), TRAINING_WAIT_S, "low's first checkpoint")
    wait_for(lambda: last_step(out / "train_log.jsonl") > every, TRAINING_WAIT_S, "a step past low's first checkpoint")
    # freeze low's rank, so it cannot finish before the preemption lands; it is let go once its
    # pod is being deleted, and then stops as a preempted rank does (the pending SIGTERM)
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)

    create("high", 2, 2)
    low = jobs.wait(lambda s: condition(s, "Queued").get("reason") == "Preempted", "low preempted", "low")
    assert low["state"] == "Queued" and low["evictions"] == 1 and low["restarts"] == 0, low
    assert low["preemptions"] == 1, low
    jobs.wait_events({"Preempted"}, "low")
    assert states(cluster, namespace)["low"] == "Queued"

    def terminating() -> bool:
        pod = kube.get_or_none(f"/api/v1/namespaces/{namespace}/pods/low-0")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    wait_for(terminating, 60, "the eviction to delete low's pod")
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: kube.get_or_none(f"/api/v1/namespaces/{namespace}/pods/low-0") is None, 90, "low's pod gone")
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*") if p.name.split("-")[1].isdigit())
    resume_from = int(saved[-1].split("-")[1])
    assert resume_from < max_steps, saved
    # the stopped ranks saved the step they were in when SIGTERM came: nothing to take again
    assert resume_from == logged_steps(out / "train_log.jsonl")[-1] > every, (
        saved,
        logged_steps(out / "train_log.jsonl"),
    )

    jobs.wait_state("Running", "high", timeout=300)
    assert states(cluster, namespace) == {"low": "Queued", "high": "Running"}
    jobs.wait_state("Succeeded", "high", timeout=TRAINING_WAIT_S)
    again = jobs.wait_state("Running", "low", timeout=300)
    assert again["evictions"] == 1 and again["restarts"] == 0, again

    resumed = f"resumed from /mnt/pvc/{CLAIM}/low/checkpoints/{saved[-1]} (step {resume_from},"
    wait_for(lambda: resumed in kubectl(cluster.kubeconfig, "logs", "-n", namespace, "low-0"), TRAINING_WAIT_S, resumed)
    done = jobs.wait_state("Succeeded", "low", timeout=TRAINING_WAIT_S)
    assert done["result"]["steps"] == max_steps and done["restarts"] == 0 and done["evictions"] == 1, done
    assert done["preemptions"] == 1, done
    # every step once: the first run's up to the preemption, then the rest; none taken again
    assert logged_steps(out / "train_log.jsonl") == list(range(1, max_steps + 1))
    assert states(cluster, namespace) == {"low": "Succeeded", "high": "Succeeded"}
