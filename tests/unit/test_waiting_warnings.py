"""A pod that waits before its containers run says why in the job's condition.

What keeps a pod in ContainerCreating (a volume attached elsewhere: Multi-Attach, a mount that
fails) is told only in Events. The reconciler reads the newest Warning Event of such a pod
(ClusterIO.pod_warning), at most every WARNING_EVERY_SECONDS, and the waiting policy puts it in
the Running=False/WaitingForWorkers message. The in-memory cluster of `tests.support.cluster`
stands in for the apiserver; decide, plan and render are the real code.
"""

from __future__ import annotations

from typing import Any

import pytest

from finetune_operator.reconcile.observed import observe
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import GpuPlacement, RenderOptions
from tests.support.cluster import (
    FakeCluster,
    config_hash_of,
    ignore_events,
    reconciler_on,
    statefulset_of,
    stored_job,
)
from tests.support.lifecycle import pod

MULTI_ATTACH = 'Multi-Attach error for volume "pvc-1" Volume is already used by pod(s) job-0'


def pending(ordinal: int, config_hash: str) -> dict[str, Any]:
    body = pod(ordinal, ready=False, config_hash=config_hash)
    body["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    return body


def created_job() -> tuple[FakeCluster, Reconciler, dict[str, Any]]:
    """A 2-node job after its first pass: the store, the reconciler and the applied StatefulSet."""
    store = FakeCluster(stored_job())
    reconciler = reconciler_on(store)
    reconciler.reconcile(store.job(), observe(None, []))
    return store, reconciler, statefulset_of(store.applied[-1])


def _running_condition(store: FakeCluster) -> dict[str, Any]:
    return next(c for c in store.body["status"]["conditions"] if c["type"] == "Running")


def test_a_pod_stuck_on_its_volume_names_the_warning_in_the_running_condition() -> None:
    store, reconciler, sts = created_job()
    stuck, first = pending(1, config_hash_of(sts)), pod(0, config_hash=config_hash_of(sts))
    store.warnings[stuck["metadata"]["uid"]] = f"FailedAttachVolume: {MULTI_ATTACH}"

    reconciler.reconcile(store.job(), observe(sts, [first, stuck]))
    running = _running_condition(store)
    assert running["reason"] == "WaitingForWorkers"
    assert running["message"] == f"1 of 2 workers ready; job-1: FailedAttachVolume: {MULTI_ATTACH}"
    assert store.warnings_read == [stuck["metadata"]["uid"]], "only the waiting pod's Events are read"

    reconciler.reconcile(store.job(), observe(sts, [first, stuck]))
    assert len(store.warnings_read) == 1, "read again only after WARNING_EVERY_SECONDS"


def test_a_pod_without_warnings_or_one_that_says_why_itself_costs_no_event_read() -> None:
    store, reconciler, sts = created_job()
    pulling = pending(1, config_hash_of(sts))
    pulling["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
    ]
    reconciler.reconcile(store.job(), observe(sts, [pod(0, config_hash=config_hash_of(sts)), pulling]))
    assert store.warnings_read == []
    assert (
        _running_condition(store)["message"] == "1 of 2 workers ready; job-1: trainer ImagePullBackOff: no such image"
    )


UNSCHEDULABLE = "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."


@pytest.mark.parametrize(
    ("placement", "hint"),
    [
        (GpuPlacement.MEMORY, "require the node label nvidia.com/gpu.memory (GPU Feature Discovery)"),
        (GpuPlacement.PRODUCT, "require the node label nvidia.com/gpu.product (GPU Feature Discovery)"),
        (GpuPlacement.RESOURCE, None),
    ],
)
def test_a_pod_no_node_can_take_says_why_in_the_running_condition(placement: GpuPlacement, hint: str | None) -> None:
    """The scheduler's own reason for a Pending pod is the job's Running message, in every GPU
    placement; where the pod requires a GPU Feature Discovery label, it also says how to place
    without one (a cluster without GFD left the pods Pending with nothing to turn it off)."""
    store = FakeCluster(stored_job())
    reconciler = Reconciler(store, RenderOptions(trainer_image="t", gpu_placement=placement), ignore_events)
    reconciler.reconcile(store.job(), observe(None, []))
    sts = statefulset_of(store.applied[-1])
    waiting = pending(1, config_hash_of(sts))
    waiting["spec"] = sts["spec"]["template"]["spec"]  # the pod the StatefulSet made from the rendered template
    waiting["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
    )

    reconciler.reconcile(store.job(), observe(sts, [pod(0, config_hash=config_hash_of(sts)), waiting]))
    running = _running_condition(store)
    assert (running["status"], running["reason"]) == ("False", "WaitingForWorkers")
    assert running["message"].startswith(f"1 of 2 workers ready; job-1: {UNSCHEDULABLE}"), running["message"]
    if hint is None:
        assert running["message"] == f"1 of 2 workers ready; job-1: {UNSCHEDULABLE}"
    else:
        assert hint in running["message"] and "gpuPlacement" in running["message"], running["message"]
