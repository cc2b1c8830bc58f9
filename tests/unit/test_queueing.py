"""Kueue admission as the lifecycle sees it: the Workload rendered for a queued job, admission
turned into placement, and eviction that scales the gang to 0 without spending restarts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from finetune_operator.reconcile.decision import Decision
from finetune_operator.reconcile.lifecycle import decide
from finetune_operator.reconcile.observed import Observed, WorkloadView, observe, owned, workload_view
from finetune_operator.reconcile.policies.queueing import finished_status, released_status
from finetune_operator.render.manifests import render_all
from finetune_operator.render.options import RenderOptions
from finetune_operator.render.workload import (
    PRIORITY_LABEL,
    QUEUE_LABEL,
    SPEC_HASH_ANNOTATION,
    priority_class_of,
    queue_of,
    with_priority,
    workload,
)
from tests.support.lifecycle import NOW, frugal, job_with, planner, pod, step, ts


def wl_body(*conditions: tuple[str, str, str, str], flavors: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": ts(NOW)}
            for t, s, r, m in conditions
        ]
    }
    if flavors is not None:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [{"name": "workers", "flavors": flavors}]}
    return {
        "metadata": {
            "name": "job",
            "uid": "wl-uid",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "FineTuneJob", "uid": "job-uid", "controller": True}],
        },
        "status": status,
    }


PENDING = wl_body(
    ("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set workers: insufficient quota")
)
ADMITTED = wl_body(
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
    flavors={"nvidia.com/gpu": "a100", "cpu": "default"},
)
EVICTED = wl_body(
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
    ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due to prioritization"),
    flavors={"nvidia.com/gpu": "a100"},
)


def run_queued(job: Any, pods: list[dict[str, Any]], wl: dict[str, Any] | None, **kw: Any) -> Decision:
    observed = observe({"spec": {"replicas": 2}}, pods)
    view = workload_view(wl) if wl is not None else None
    if view is not None and kw.pop("current", True):  # the Workload asks for what the job needs now
        desired = workload(job, planner(job.spec), job.spec.queue_name or "")
        view = replace(view, spec_hash=desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION])
    if view is not None and "labels" in kw:
        view = replace(view, node_labels=tuple(sorted(kw.pop("labels").items())))
    return decide(
        job,
        replace(observed, workload=view),
        NOW,
        planner=planner,
        replanner=frugal,
        desired_config_hash=lambda _p: "h1",
        default_queue=kw.pop("default_queue", None),
    )


def test_a_job_without_a_queue_is_not_queued() -> None:
    decision = run_queued(job_with(), [], None)
    assert decision.workload is None and decision.replicas == 2
    assert all(c.type != "Queued" for c in decision.status.conditions)


def test_a_queued_job_without_a_workload_creates_one_and_starts_nothing() -> None:
    decision = run_queued(job_with(queueName="team-a"), [], None)
    assert decision.status.state == "Queued" and decision.replicas == 0
    assert decision.workload is not None and decision.workload["spec"]["queueName"] == "team-a"


def test_the_default_queue_applies_to_jobs_that_name_none() -> None:
    decision = run_queued(job_with(), [], None, default_queue="shared")
    assert decision.workload is not None and decision.workload["spec"]["queueName"] == "shared"
    assert queue_of(job_with(queueName="mine"), RenderOptions(default_queue_name="shared")) == "mine"


def test_pending_workload_says_kueues_reason_and_message() -> None:
    decision = run_queued(job_with(queueName="team-a"), [], PENDING)
    queued = next(c for c in decision.status.conditions if c.type == "Queued")
    assert (queued.status, queued.reason) == ("True", "Pending")
    assert "insufficient quota" in queued.message and "team-a" in queued.message
    assert decision.replicas == 0 and decision.workload is None and decision.status.state == "Queued"


def test_admission_starts_the_gang_on_the_flavors_node_labels() -> None:
    job, _ = step(job_with(queueName="team-a"), [])
    decision = run_queued(job, [], ADMITTED, labels={"gpu.product": "a100"})
    assert decision.replicas == 2 and decision.status.state == "Planned"
    queued = next(c for c in decision.status.conditions if c.type == "Queued")
    assert (queued.status, queued.reason) == ("False", "Admitted") and "a100" in queued.message
    assert decision.placement == {"gpu.product": "a100"}
    assert decision.plan is not None
    sts = render_all(job, decision.plan, RenderOptions(), 2, placement=decision.placement)[2]
    assert sts["spec"]["template"]["spec"]["nodeSelector"]["gpu.product"] == "a100"


def test_eviction_scales_to_zero_counts_once_and_spends_no_restart() -> None:
    job, _ = step(job_with(queueName="team-a"), [])
    decision = run_queued(job, [pod(0), pod(1)], ADMITTED)
    assert decision.status.state == "Running"
    job = job.model_copy(update={"status": decision.status})
    evicted = run_queued(job, [pod(0), pod(1)], EVICTED)
    status = evicted.status
    assert evicted.replicas == 0 and status.state == "Queued"
    assert status.evictions == 1 and status.restarts == 0
    assert status.preemptions == 1, "a preemption, counted apart from failures"
    assert "Preempted" in [e.reason for e in evicted.events]
    assert not evicted.release_workload, "quota goes back only once the pods are gone"
    job = job.model_copy(update={"status": status})
    stopped = run_queued(job, [], EVICTED)
    assert stopped.release_workload and stopped.status.evictions == 1 and stopped.status.restarts == 0
    assert stopped.status.preemptions == 1
    assert not stopped.events


def test_released_status_clears_the_admission_as_a_kueue_job_controller_does() -> None:
    view = workload_view(EVICTED)
    status = released_status(view, ts(NOW))
    by_type = {c["type"]: c for c in status["conditions"]}
    assert status["admission"] is None
    assert (by_type["QuotaReserved"]["status"], by_type["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert by_type["Admitted"]["status"] == "False"
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == ("True", "Preempted")
    assert by_type["Evicted"]["status"] == "True", "Kueue clears Evicted when it admits again"


@pytest.mark.parametrize(("outcome", "reason"), [("Succeeded", "Succeeded"), ("Failed", "Failed")])
def test_a_finished_job_marks_its_workload_finished(outcome: str, reason: str) -> None:
    view = workload_view(ADMITTED)
    status = finished_status(view, reason, ts(NOW))
    finished = next(c for c in status["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", reason)
    assert outcome.lower() in finished["message"].lower()


def test_the_workload_is_one_pod_set_of_the_gang_with_the_pods_requests() -> None:
    job = job_with(queueName="team-a")
    plan = planner(job.spec)
    body = workload(job, plan, "team-a")
    assert body["apiVersion"] == "kueue.x-k8s.io/v1beta2" and body["kind"] == "Workload"
    assert body["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    (pod_set,) = body["spec"]["podSets"]
    assert pod_set["count"] == 2
    sts = render_all(job, plan, RenderOptions(), 2)[2]["spec"]["template"]["spec"]
    (container,) = pod_set["template"]["spec"]["containers"]
    assert container["resources"] == sts["containers"][0]["resources"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8  # Kueue counts requests, defaulted from limits
    assert pod_set["template"]["spec"].get("affinity") == sts.get("affinity")


def test_only_the_workload_the_job_controls_counts() -> None:
    mine, foreign = workload_view(ADMITTED), replace(workload_view(ADMITTED), owner_uid="someone-else")
    assert owned("job", "job-uid", [], [], [foreign]).workload is None
    assert owned("job", "job-uid", [], [], [foreign, mine]).workload == mine
    assert isinstance(owned("job", "job-uid", [], []), Observed)


def test_admitted_means_admitted_and_not_evicted() -> None:
    assert workload_view(ADMITTED).admitted
    assert not workload_view(EVICTED).admitted
    assert not workload_view(PENDING).admitted
    view: WorkloadView = workload_view(ADMITTED)
    assert view.flavors == ("a100", "default")


def test_the_priority_class_label_becomes_the_workloads_priority() -> None:
    job = job_with(queueName="team-a")
    assert priority_class_of(job) is None
    labelled = job.model_copy(
        update={"metadata": job.metadata.model_copy(update={"labels": {PRIORITY_LABEL: "urgent"}})}
    )
    assert priority_class_of(labelled) == "urgent"
    body = with_priority(workload(labelled, planner(labelled.spec), "team-a"), "urgent", 1000)
    assert body["spec"]["priority"] == 1000
    assert body["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"
    }  # fmt: skip


def test_a_resized_job_replaces_its_workload_once_its_gang_has_stopped() -> None:
    job, _ = step(job_with(queueName="team-a"), [])
    running = run_queued(job, [pod(0), pod(1)], ADMITTED)
    job = job.model_copy(update={"status": running.status})
    stale = run_queued(job, [pod(0), pod(1)], ADMITTED, current=False)
    queued = next(c for c in stale.status.conditions if c.type == "Queued")
    assert (queued.status, queued.reason) == ("True", "WorkloadChanged")
    assert stale.replicas == 0 and not stale.delete_workload and stale.status.restarts == 0
    job = job.model_copy(update={"status": stale.status})
    stopped = run_queued(job, [], ADMITTED, current=False)
    assert stopped.delete_workload and stopped.workload is None
    again = run_queued(job, [], None)
    assert again.workload is not None, "the next pass creates the new Workload"


def test_the_workload_hash_follows_size_and_queue() -> None:
    job = job_with(queueName="team-a")
    plan = planner(job.spec)
    base = workload(job, plan, "team-a")["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    assert workload(job, plan, "team-a")["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == base
    other_queue = workload(job, plan, "team-b")["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    bigger = job.model_copy(
        update={
            "spec": job.spec.model_copy(update={"resources": job.spec.resources.model_copy(update={"num_nodes": 4})})
        }
    )
    resized = workload(bigger, planner(bigger.spec), "team-a")["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    assert len({base, other_queue, resized}) == 3


def test_a_suspended_job_gives_its_quota_back_and_queues_again_on_resume() -> None:
    job, _ = step(job_with(queueName="team-a"), [])
    suspended = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": True})})
    stopping = run_queued(suspended, [pod(0), pod(1)], ADMITTED)
    assert stopping.status.state == "Suspended" and stopping.replicas == 0 and not stopping.delete_workload
    stopped = run_queued(suspended, [], ADMITTED)
    assert stopped.delete_workload
    resumed = run_queued(job.model_copy(update={"status": stopped.status}), [], None)
    assert resumed.status.state == "Queued" and resumed.workload is not None
