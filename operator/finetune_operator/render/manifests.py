"""Every object the operator creates for a job, in apply order.

`render_all` is the one entry point: the reconciler server-side applies its output
and `ftjob render` prints it. The config hash in the pod template changes exactly
when the files in the ConfigMap change, which is how the operator knows the running
gang is stale and must be restarted together.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..api.job import FineTuneJob
from ..api.status import PlanStatus
from .config_files import config_files
from .identity import config_map_name, labels, metadata, selector_labels
from .options import RenderOptions
from .scratch import scratch_bytes
from .stop_grace import termination_grace_seconds
from .tracking import with_default_tracking
from .workers import headless_service, statefulset


def config_map(job: FineTuneJob, plan: PlanStatus) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, config_map_name(job), "config"),
        "data": config_files(job, plan),
    }


def config_hash(config: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(config["data"].items()):
        digest.update(key.encode() + b"\0" + value.encode() + b"\0")
    return digest.hexdigest()[:16]


def gang_hash(job: FineTuneJob, plan: PlanStatus, options: RenderOptions) -> str:
    """Identity of what a rank runs: the config files plus the pod template.

    Pods carry it as an annotation; when it differs from the desired one, the running
    gang is stale (new plan, image, env, resources) and is restarted as a whole.
    """
    job = with_default_tracking(job, options.default_tracking_uri)
    scratch = scratch_bytes(job.spec, plan)
    # rendered at the floor: the grace follows the measured save time, which changes while the gang
    # runs and is not what a rank runs (`stop_grace`)
    template = statefulset(job, options, 0, "", plan.host_bytes_per_node, scratch_bytes=scratch)["spec"]["template"]
    digest = hashlib.sha256(config_hash(config_map(job, plan)).encode())
    digest.update(json.dumps(template, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def pod_monitor(job: FineTuneJob, options: RenderOptions) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping every rank's metrics port."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {**metadata(job, job.name, "metrics"), "labels": labels(job, "metrics")},
        "spec": {
            "selector": {"matchLabels": selector_labels(job)},
            "podMetricsEndpoints": [
                {
                    "port": f"metrics-{rank}",
                    "interval": "15s",
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_finetune_dev_job_name"],
                            "targetLabel": "finetune_job",
                        }
                    ],
                }
                for rank in range(job.spec.resources.ranks_per_node)
            ],
        },
    }


def render_all(
    job: FineTuneJob,
    plan: PlanStatus,
    options: RenderOptions,
    replicas: int,
    gang: str | None = None,
    *,
    placement: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, headless Service, StatefulSet (and PodMonitor when enabled).

    `gang` is `gang_hash(job, plan, options)` when the caller has it already (it renders
    the config files and the pod template a second time). `placement` is the nodeLabels of
    the ResourceFlavors Kueue admitted the job on: they join the pods' nodeSelector.
    """
    job = with_default_tracking(job, options.default_tracking_uri)
    config = config_map(job, plan)
    workers = statefulset(
        job,
        options,
        replicas,
        gang if gang is not None else gang_hash(job, plan, options),
        plan.host_bytes_per_node,
        scratch_bytes=scratch_bytes(job.spec, plan),
        model_bytes=plan.model_bytes,
        grace_seconds=termination_grace_seconds(job, plan, options.termination_grace_seconds),
    )
    if placement:
        pod_spec = workers["spec"]["template"]["spec"]
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **placement}
    objects = [config, headless_service(job, options), workers]
    if options.pod_monitor:
        objects.append(pod_monitor(job, options))
    return objects
