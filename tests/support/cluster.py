"""An in-memory cluster for the real Reconciler, and readers of what it was asked to apply.

`FakeCluster` implements `ClusterIO` (structurally: mypy checks it against the Protocol) for
one job: the job object as the apiserver keeps it (`body`), whose resourceVersion moves on
every status write and refuses a write decided on an older one (409 → `Conflict`), and a
record of every other call for the test to read. It stands in for the apiserver only; decide,
plan, render and the config hashes stay the real code. A test that needs the cluster to
misbehave subclasses it and overrides one method.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from finetune_operator.reconcile.cluster_io import ChildWriteError, Conflict
from finetune_operator.reconcile.decision import Event
from finetune_operator.reconcile.runner import EventSink, Reconciler
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document

CONFIG_HASH = "finetune.dev/config-hash"


def stored_job(uid: str = "u1", **spec: Any) -> dict[str, Any]:
    """A 2-node × 8-GPU job as the apiserver stores it (uid, resourceVersion 1, generation 1)."""
    doc = job_document(resources={"numNodes": 2, "gpusPerNode": 8}, **spec)
    doc["metadata"].update({"uid": uid, "resourceVersion": "1", "generation": 1})
    return doc


class FakeCluster:
    """`ClusterIO` in memory, for one job (see the module docstring)."""

    def __init__(self, body: dict[str, Any], access_modes: tuple[str, ...] | None = ("ReadWriteMany",)) -> None:
        self.body = body
        self.access_modes = access_modes
        self.reads = 0
        """How often the Reconciler read the job (`read_job`)."""
        self.applied: list[list[dict[str, Any]]] = []
        self.served: list[tuple[list[dict[str, Any]], str]] = []
        """Each `apply_served` call: the serving objects and the job uid."""
        self.serving_error: ChildWriteError | None = None
        """Raised by `apply_served` when set (KServe not installed, an object of another job)."""
        self.owner_uids: list[str] = []
        self.deleted_pods: list[list[tuple[str, str]]] = []
        self.warnings: dict[str, str] = {}
        """Pod uid → its newest Warning Event, as `pod_warning` reports it."""
        self.warnings_read: list[str] = []
        self.flavors: dict[str, dict[str, str]] = {}
        self.priorities: dict[str, int] = {}
        self.workload_statuses: list[tuple[str, dict[str, Any]]] = []
        self.deleted_workloads: list[tuple[str, str]] = []
        self.job_deleted = False

    def job(self) -> dict[str, Any]:
        """A copy of the job as stored (what the next watch event carries); not counted in `reads`."""
        return copy.deepcopy(self.body)

    def apply(self, objects: Iterable[dict[str, Any]], owner_uid: str) -> None:
        self.applied.append(list(objects))
        self.owner_uids.append(owner_uid)

    def apply_served(self, objects: Iterable[dict[str, Any]], job_uid: str) -> None:
        if self.serving_error is not None:
            raise self.serving_error
        self.served.append((list(objects), job_uid))

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]]) -> None:
        self.deleted_pods.append(list(pods))

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return None if self.job_deleted else copy.deepcopy(self.body)

    def patch_status(self, namespace: str, name: str, resource_version: str | None, status: dict[str, Any]) -> str:
        """Merge `status` into the job's (None removes a key) if `resource_version` is the stored one."""
        meta = self.body["metadata"]
        if resource_version != meta["resourceVersion"]:
            raise Conflict(f"resourceVersion {resource_version} is stale: the job is at {meta['resourceVersion']}")
        merged = {**(self.body.get("status") or {}), **status}
        self.body["status"] = {k: v for k, v in merged.items() if v is not None}
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return str(meta["resourceVersion"])

    def claim_access_modes(self, namespace: str, claim: str) -> tuple[str, ...] | None:
        return self.access_modes

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The last ConfigMap of that name the Reconciler applied, as stored."""
        for objects in reversed(self.applied):
            for obj in objects:
                if obj.get("kind") == "ConfigMap" and obj["metadata"]["name"] == name:
                    found: dict[str, Any] = copy.deepcopy(obj)
                    return found
        return None

    def pod_warning(self, namespace: str, pod_uid: str) -> str | None:
        self.warnings_read.append(pod_uid)
        return self.warnings.get(pod_uid)

    def workload_status(self, namespace: str, name: str, resource_version: str, status: dict[str, Any]) -> None:
        self.workload_statuses.append((name, status))

    def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        self.deleted_workloads.append((name, uid))

    def flavor_node_labels(self, flavor: str) -> dict[str, str]:
        return dict(self.flavors.get(flavor, {}))

    def workload_priority(self, priority_class: str) -> int | None:
        return self.priorities.get(priority_class)

    def delete_job(self, namespace: str, name: str) -> None:
        self.job_deleted = True


def ignore_events(body: Mapping[str, Any], event: Event) -> None:
    """An event sink that drops every Event."""


def reconciler_on(cluster: FakeCluster, sink: EventSink = ignore_events) -> Reconciler:
    """The real Reconciler (trainer image `t`) on an in-memory cluster."""
    return Reconciler(cluster, RenderOptions(trainer_image="t"), sink)


def statefulset_of(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The StatefulSet among applied children."""
    return next(o for o in objects if o["kind"] == "StatefulSet")


def plan_of(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The plan the applied children carry (their ConfigMap's plan.json)."""
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    return dict(json.loads(config["data"]["plan.json"]))


def config_hash_of(statefulset: dict[str, Any]) -> str:
    """The config hash a StatefulSet stamps on its pods (what a pod of the current gang carries)."""
    return str(statefulset["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH])
