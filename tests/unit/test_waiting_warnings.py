"""A pod that waits before its containers run says why in the job's condition.

What keeps a pod in ContainerCreating (a volume attached elsewhere: Multi-Attach, a mount that
fails) is told only in Events. The reconciler reads the newest Warning Event of such a pod
(ClusterIO.pod_warning), at most every WARNING_EVERY_SECONDS, and the waiting policy puts it in
the Running=False/WaitingForWorkers message. The store stands in for the apiserver as in
test_reconciler_stale_body; decide, plan and render are the real code.
"""

from __future__ import annotations

from typing import Any, cast

from finetune_operator.reconcile.cluster_io import ClusterIO
from finetune_operator.reconcile.observed import observe
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document
from tests.unit.test_lifecycle import pod
from tests.unit.test_reconciler_stale_body import JobStore

MULTI_ATTACH = 'Multi-Attach error for volume "pvc-1" Volume is already used by pod(s) job-0'


class Events(JobStore):
    def __init__(self, body: dict[str, Any], warnings: dict[str, str]) -> None:
        super().__init__(body)
        self.warnings, self.asked = warnings, []  # type: ignore[var-annotated]

    def pod_warning(self, namespace: str, pod_uid: str) -> str | None:
        self.asked.append(pod_uid)
        return self.warnings.get(pod_uid)


def gang_hash(sts: dict[str, Any]) -> str:
    return str(sts["spec"]["template"]["metadata"]["annotations"]["finetune.dev/config-hash"])


def pending(ordinal: int, config_hash: str) -> dict[str, Any]:
    body = pod(ordinal, ready=False, config_hash=config_hash)
    body["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    return body


def created_job() -> tuple[Events, Reconciler, dict[str, Any]]:
    """A 2-node job after its first pass: the store, the reconciler and the applied StatefulSet."""
    doc = job_document(resources={"numNodes": 2, "gpusPerNode": 8})
    doc["metadata"].update({"uid": "u1", "resourceVersion": "1", "generation": 1})
    store = Events(doc, {})
    reconciler = Reconciler(cast(ClusterIO, store), RenderOptions(trainer_image="t"), lambda *_: None)
    reconciler.reconcile(store.read_job("", ""), observe(None, []))
    return store, reconciler, next(o for o in store.applied[-1] if o["kind"] == "StatefulSet")


def _running_condition(store: JobStore) -> dict[str, Any]:
    return next(c for c in store.body["status"]["conditions"] if c["type"] == "Running")


def test_a_pod_stuck_on_its_volume_names_the_warning_in_the_running_condition() -> None:
    store, reconciler, sts = created_job()
    stuck, first = pending(1, gang_hash(sts)), pod(0, config_hash=gang_hash(sts))
    store.warnings[stuck["metadata"]["uid"]] = f"FailedAttachVolume: {MULTI_ATTACH}"

    reconciler.reconcile(store.read_job("", ""), observe(sts, [first, stuck]))
    running = _running_condition(store)
    assert running["reason"] == "WaitingForWorkers"
    assert running["message"] == f"1 of 2 workers ready; job-1: FailedAttachVolume: {MULTI_ATTACH}"
    assert store.asked == [stuck["metadata"]["uid"]], "only the waiting pod's Events are read"

    reconciler.reconcile(store.read_job("", ""), observe(sts, [first, stuck]))
    assert len(store.asked) == 1, "read again only after WARNING_EVERY_SECONDS"


def test_a_pod_without_warnings_or_one_that_says_why_itself_costs_no_event_read() -> None:
    store, reconciler, sts = created_job()
    pulling = pending(1, gang_hash(sts))
    pulling["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
    ]
    reconciler.reconcile(store.read_job("", ""), observe(sts, [pod(0, config_hash=gang_hash(sts)), pulling]))
    assert store.asked == []
    assert (
        _running_condition(store)["message"] == "1 of 2 workers ready; job-1: trainer ImagePullBackOff: no such image"
    )
