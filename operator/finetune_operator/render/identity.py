"""Names, labels and owner references shared by every child of a FineTuneJob.

Children carry the `app.kubernetes.io/*` labels plus `finetune.dev/job-name`, which is
what the operator's watches select on; every child is owned by the job (controller
reference) so deleting the job garbage-collects them. Nothing here reads a clock or
invents a name: the same job always yields the same identities.
"""

from __future__ import annotations

from typing import Any

from ..api.job import API_VERSION, KIND, FineTuneJob

JOB_NAME_LABEL = "finetune.dev/job-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
CONFIG_HASH_ANNOTATION = "finetune.dev/config-hash"
FIELD_MANAGER = "finetune-operator"


def workers_name(job: FineTuneJob) -> str:
    """StatefulSet name; pods are `<job>-<ordinal>`."""
    return job.name


def service_name(job: FineTuneJob) -> str:
    return f"{job.name}-workers"


def config_map_name(job: FineTuneJob) -> str:
    return f"{job.name}-config"


def selector_labels(job: FineTuneJob) -> dict[str, str]:
    return {JOB_NAME_LABEL: job.name, "app.kubernetes.io/instance": job.name}


def labels(job: FineTuneJob, component: str) -> dict[str, str]:
    return {
        **selector_labels(job),
        "app.kubernetes.io/name": "finetune-job",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "finetune-operator",
        "app.kubernetes.io/managed-by": "finetune-operator",
    }


def owner_reference(job: FineTuneJob) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(job: FineTuneJob, name: str, component: str) -> dict[str, Any]:
    """Object metadata; the owner reference needs the job's uid, so offline renders omit it."""
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels(job, component)}
    if job.metadata.uid:
        meta["ownerReferences"] = [owner_reference(job)]
    return meta


def rank0_host(job: FineTuneJob) -> str:
    return f"{workers_name(job)}-0.{service_name(job)}.{job.namespace}.svc"
