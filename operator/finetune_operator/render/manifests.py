"""Every object the operator creates for a job, in apply order.

`render_gang` is the one entry point: it renders the objects once per pass, the reconciler
server-side applies them and `ftjob render` prints them (`render_all`). The gang hash in the
pod template, taken from the objects rendered, changes exactly when what a rank runs changes,
which is how the operator knows the running gang is stale and must be restarted together.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api.job import FineTuneJob
from ..api.pod_env import PodEnv
from ..api.status import PlanStatus
from .config_files import config_files
from .identity import CONFIG_HASH_ANNOTATION, config_map_name, labels, metadata, selector_labels
from .options import RenderOptions
from .placement import node_selector
from .scratch import scratch_bytes
from .stop_grace import ranks_stop_seconds, termination_grace_seconds
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


@dataclass(frozen=True)
class Gang:
    """One render of a job's children (`objects`, in apply order) and the gang hash taken from them."""

    objects: list[dict[str, Any]]
    hash: str


def _identity(job: FineTuneJob, template: dict[str, Any], floor: int) -> dict[str, Any]:
    """The pod template as the gang's identity: what a rank runs, without what may change under a
    running gang: the stop grace (it follows the measured save time, `stop_grace`; taken at the
    operator's floor), Kueue's placement (the admitted flavor's nodeLabels; the job's own
    nodeSelector stays) and the hash annotation itself. Equal to the template rendered at the floor,
    without a placement and with an empty hash, so the hash of a job is what it was before the
    render took a placement."""
    identity = copy.deepcopy(template)
    identity["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = ""
    pod_spec = identity["spec"]
    pod_spec["terminationGracePeriodSeconds"] = floor
    if PodEnv.FTJOB_STOP_GRACE_SECONDS not in {var.name for var in job.spec.env or []}:
        default = next(e for e in pod_spec["containers"][0]["env"] if e["name"] == PodEnv.FTJOB_STOP_GRACE_SECONDS)
        default["value"] = str(ranks_stop_seconds(floor))
    if selector := node_selector(job):
        pod_spec["nodeSelector"] = selector
    else:
        pod_spec.pop("nodeSelector", None)
    return identity


def _gang_hash(job: FineTuneJob, config: dict[str, Any], workers: dict[str, Any], floor: int) -> str:
    """Identity of what a rank runs: the config files plus the pod template (`_identity`).

    Pods carry it as an annotation; when it differs from the desired one, the running
    gang is stale (new plan, image, env, resources) and is restarted as a whole.
    """
    template = _identity(job, workers["spec"]["template"], floor)
    digest = hashlib.sha256(config_hash(config).encode())
    digest.update(json.dumps(template, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def gang_hash(job: FineTuneJob, plan: PlanStatus, options: RenderOptions) -> str:
    """The gang hash alone (`render_gang(...).hash`): for a pass that decides without applying."""
    return render_gang(job, plan, options, 0).hash


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


def render_gang(
    job: FineTuneJob,
    plan: PlanStatus,
    options: RenderOptions,
    replicas: int,
    *,
    placement: Mapping[str, str] | None = None,
) -> Gang:
    """ConfigMap, headless Service, StatefulSet (and PodMonitor when enabled), rendered once, and the
    gang hash taken from them; `placement` is the nodeLabels of the ResourceFlavors Kueue admitted the
    job on: they join the pods' nodeSelector."""
    job = with_default_tracking(job, options.default_tracking_uri)
    config = config_map(job, plan)
    workers = statefulset(
        job,
        options,
        replicas,
        "",
        plan.host_bytes_per_node,
        scratch_bytes=scratch_bytes(job.spec, plan),
        model_bytes=plan.model_bytes,
        grace_seconds=termination_grace_seconds(job, plan, options.termination_grace_seconds),
        placement=placement,
    )
    gang = _gang_hash(job, config, workers, options.termination_grace_seconds)
    workers["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = gang
    objects = [config, headless_service(job, options), workers]
    if options.pod_monitor:
        objects.append(pod_monitor(job, options))
    return Gang(objects, gang)


def render_all(
    job: FineTuneJob,
    plan: PlanStatus,
    options: RenderOptions,
    replicas: int,
    *,
    placement: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The objects of `render_gang` (`ftjob render` prints them)."""
    return render_gang(job, plan, options, replicas, placement=placement).objects
