"""The Kueue Workload that stands for a queued job: one pod set of `numNodes` identical pods.

Why a Workload of our own (Kueue's protocol for custom job kinds) rather than Kueue's
StatefulSet integration: Kueue admits the whole pod set or nothing, counts exactly the
requests the trainer pods make (GPUs, CPU, the plan's host memory), and says which
ResourceFlavor it chose; the operator, which owns the gang, starts it only once admitted and
sees an eviction as a condition, not as pods vanishing (which would read as a rank failure).

The pod set carries only what Kueue decides on: the trainer container's requests and the
pods' placement (nodeSelector, affinity, tolerations, priorityClassName). Kueue treats the pod
sets of an admitted Workload as immutable, so the operator creates it once and never rewrites it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..api.job import FineTuneJob
from ..api.status import PlanStatus
from .identity import metadata
from .options import RenderOptions
from .scratch import scratch_bytes
from .workers import statefulset

WORKLOAD_API_VERSION = "kueue.x-k8s.io/v1beta2"
POD_SET = "workers"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""On the FineTuneJob, as on any Kueue-managed job: the WorkloadPriorityClass of its Workload."""
PLACEMENT_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName")
SPEC_HASH_ANNOTATION = "finetune.dev/workload-hash"
"""What the Workload asks for: when the job's requests or size change, the Workload is replaced."""


def queue_of(job: FineTuneJob, options: RenderOptions) -> str | None:
    """The LocalQueue the job waits in: its own, else the operator's default (None: not queued)."""
    return job.spec.queue_name or options.default_queue_name


def priority_class_of(job: FineTuneJob) -> str | None:
    return (job.metadata.labels or {}).get(PRIORITY_LABEL) or None


def with_priority(body: dict[str, Any], priority_class: str, value: int) -> dict[str, Any]:
    """The Workload with its WorkloadPriorityClass and that class's value (Kueue orders and preempts by it)."""
    ref = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": priority_class}
    return {**body, "spec": {**body["spec"], "priorityClassRef": ref, "priority": value}}


def workload(job: FineTuneJob, plan: PlanStatus, queue: str) -> dict[str, Any]:
    pod = statefulset(
        job,
        RenderOptions(),
        job.spec.resources.num_nodes,
        "",
        plan.host_bytes_per_node,
        scratch_bytes=scratch_bytes(job.spec, plan),
    )
    pod_spec = pod["spec"]["template"]["spec"]
    trainer = pod_spec["containers"][0]
    spec: dict[str, Any] = {
        "containers": [{"name": trainer["name"], "resources": trainer["resources"]}],
        **{key: pod_spec[key] for key in PLACEMENT_FIELDS if key in pod_spec},
    }
    meta = metadata(job, job.name, "workload")
    meta["labels"] = {**meta["labels"], QUEUE_LABEL: queue}
    body = {
        "queueName": queue,
        "podSets": [{"name": POD_SET, "count": job.spec.resources.num_nodes, "template": {"spec": spec}}],
    }
    meta["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(body)}
    return {"apiVersion": WORKLOAD_API_VERSION, "kind": "Workload", "metadata": meta, "spec": body}


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
