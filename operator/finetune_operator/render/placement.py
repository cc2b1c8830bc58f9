"""Where the trainer pods may run, and what the user's `spec.podTemplate` adds to them.

GPU placement: `resources.gpuMemory` feeds the planner, so the pods must land on nodes whose
GPUs have that memory. GPU Feature Discovery labels nodes with `nvidia.com/gpu.memory` in
MiB, and cards report a little less than their nominal size (an H100 80GB says 81559, an L4
23034 for 24Gi), so the requirement is "more than 93% of gpuMemory" (Gt). It is added to every
required node selector term of the user's own affinity (terms are ORed, expressions ANDed).
GPU nodes are usually tainted `nvidia.com/gpu:NoSchedule`, hence the default toleration.

The overlay (api.pod_template) is merged under the operator's fields: its validation has
already refused anything that would override them, and where both set the same map key
(nodeSelector) the operator's value wins.
"""

from __future__ import annotations

import copy
from typing import Any

from ..api.job import FineTuneJob

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_MEMORY_FRACTION = 0.93
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_memory_floor_mib(job: FineTuneJob) -> int:
    """The `nvidia.com/gpu.memory` value (MiB) a node's label must exceed."""
    return int(job.spec.resources.gpu_memory_bytes / 2**20 * GPU_MEMORY_FRACTION)


def affinity(job: FineTuneJob) -> dict[str, Any] | None:
    """The user's affinity with the GPU-memory node requirement ANDed into every required term."""
    overlay = job.spec.pod_template
    out: dict[str, Any] = copy.deepcopy(overlay.affinity) if overlay and overlay.affinity else {}
    if job.spec.resources.gpus_per_node:
        requirement = {"key": GPU_MEMORY_LABEL, "operator": "Gt", "values": [str(gpu_memory_floor_mib(job))]}
        node = out.setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        for term in terms:
            term["matchExpressions"] = [*term.get("matchExpressions", []), requirement]
    return out or None


def tolerations(job: FineTuneJob) -> list[dict[str, Any]]:
    """The default GPU toleration (GPU jobs), then spec.resources', then the overlay's; no duplicates."""
    out: list[dict[str, Any]] = [dict(GPU_TOLERATION)] if job.spec.resources.gpus_per_node else []
    overlay = job.spec.pod_template
    for t in [*(job.spec.resources.tolerations or []), *((overlay.tolerations if overlay else None) or [])]:
        wire = t.to_wire()
        if wire not in out:
            out.append(wire)
    return out


def node_selector(job: FineTuneJob) -> dict[str, str]:
    overlay = job.spec.pod_template
    merged = {**((overlay.node_selector if overlay else None) or {}), **(job.spec.resources.node_selector or {})}
    return dict(sorted(merged.items()))


def apply_overlay(job: FineTuneJob, pod_metadata: dict[str, Any], pod_spec: dict[str, Any]) -> None:
    """Add the overlay's fields to the rendered pod (the operator's keys win)."""
    overlay = job.spec.pod_template
    if overlay is None:
        return
    if overlay.metadata is not None:
        for key in ("labels", "annotations"):
            extra = getattr(overlay.metadata, key) or {}
            if extra:
                pod_metadata[key] = {**dict(sorted(extra.items())), **pod_metadata.get(key, {})}
    container = pod_spec["containers"][0]
    if overlay.resources:
        extra_resources = {k: str(v) for k, v in sorted(overlay.resources.items())}
        resources = container.setdefault("resources", {})
        for kind in ("limits", "requests"):
            resources[kind] = {**extra_resources, **resources.get(kind, {})}
    if overlay.volumes:
        pod_spec["volumes"] = [*pod_spec["volumes"], *copy.deepcopy(overlay.volumes)]
    if overlay.volume_mounts:
        container["volumeMounts"] = [*container["volumeMounts"], *(m.to_wire() for m in overlay.volume_mounts)]
    if overlay.capabilities is not None and overlay.capabilities.add:
        container["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": list(overlay.capabilities.add)}
    for key, value in (
        ("runtimeClassName", overlay.runtime_class_name),
        ("schedulerName", overlay.scheduler_name),
        ("priorityClassName", overlay.priority_class_name),
    ):
        if value is not None:
            pod_spec[key] = value
    if overlay.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in overlay.image_pull_secrets]
