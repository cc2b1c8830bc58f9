"""What the reconciler writes to Kueue for a queued job, as its Workload's job controller.

`lifecycle.decide` says what should happen to the Workload (`Decision.workload`,
`release_workload`, `delete_workload`, `finish_workload`); this carries it out: create the
Workload with its priority, delete it, give an evicted one's quota back, mark a finished one
Finished. It also reads the admitted ResourceFlavors' nodeLabels, which the pods' nodeSelector
takes (cached: flavors rarely change).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api.job import FineTuneJob
from ..api.timestamps import timestamp
from ..render.workload import priority_class_of, with_priority
from .cluster_io import ChildWriteError, ClusterIO
from .decision import Decision
from .observed import Observed, WorkloadView
from .policies.queueing import finished_status, released_status

KUEUE_NOT_SERVED = (
    "404: this cluster does not serve Kueue's Workload API (kueue.x-k8s.io/v1beta2): install Kueue, or run "
    "the job without a queue (remove spec.queueName)"
)


class KueueWrites:
    def __init__(self, cluster: ClusterIO) -> None:
        self.cluster = cluster
        self._flavors: dict[str, dict[str, str]] = {}

    def write(self, job: FineTuneJob, decision: Decision, wl: WorkloadView | None, now: datetime) -> None:
        """Carry out the decision on the job's Workload `wl`; `ChildWriteError` when it cannot be created."""
        namespace, stamp = job.namespace, timestamp(now)
        if decision.workload is not None and wl is None:
            try:
                self.cluster.apply([self._prioritised(decision.workload, job)], job.metadata.uid or "")
            except ChildWriteError as exc:
                if exc.status == 404 and exc.kind == "Workload":  # the job's namespace exists: the API does not
                    raise ChildWriteError(exc.kind, exc.name, 404, KUEUE_NOT_SERVED) from exc
                raise
        if wl is not None and decision.delete_workload:
            self.cluster.delete_workload(namespace, wl.name, wl.uid)
        if wl is not None and decision.release_workload:
            self.cluster.workload_status(namespace, wl.name, wl.resource_version, released_status(wl, stamp))
        if wl is not None and decision.finish_workload:
            status = finished_status(wl, decision.finish_workload, stamp)
            self.cluster.workload_status(namespace, wl.name, wl.resource_version, status)

    def _prioritised(self, body: dict[str, Any], job: FineTuneJob) -> dict[str, Any]:
        """The Workload with the value of the job's WorkloadPriorityClass (label `kueue.x-k8s.io/priority-class`)."""
        priority_class = priority_class_of(job)
        if priority_class is None:
            return body
        try:
            value = self.cluster.workload_priority(priority_class)
        except ApiException as exc:
            raise ChildWriteError("WorkloadPriorityClass", priority_class, exc.status, str(exc.reason)) from exc
        if value is None:
            raise ChildWriteError("WorkloadPriorityClass", priority_class, 404, "not found: create it or fix the label")
        return with_priority(body, priority_class, value)

    def with_flavors(self, observed: Observed) -> Observed:
        """The admitted Workload with its flavors' nodeLabels (read from the ResourceFlavors, cached)."""
        wl = observed.workload
        if wl is None or not wl.admitted or not wl.flavors:
            return observed
        labels: dict[str, str] = {}
        for flavor in wl.flavors:
            if flavor not in self._flavors:
                self._flavors[flavor] = self.cluster.flavor_node_labels(flavor)
            labels.update(self._flavors[flavor])
        return replace(observed, workload=replace(wl, node_labels=tuple(sorted(labels.items()))))
