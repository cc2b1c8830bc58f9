"""Where the trainer pods may run, and what the user's `spec.podTemplate` adds to them.

GPU placement: `resources.gpuMemory` feeds the planner, so the pods must land on nodes whose
GPUs have that memory. How is an operator setting (`RenderOptions.gpu_placement`):
- `memory` (default): GPU Feature Discovery labels nodes with `nvidia.com/gpu.memory` in MiB, and
  cards report a little less than their nominal size (an H100 80GB says 81559, an L4 23034 for
  24Gi), so the requirement is "more than 93% of gpuMemory" (Gt);
- `product`: `nvidia.com/gpu.product` In the known products (`GPU_PRODUCTS`) with that much memory;
- `resource`: no label at all, only the device plugin's `nvidia.com/gpu` resource: clusters
  without GFD (GKE's default, EKS with only the device plugin) left the pods Pending forever.
The requirement is added to every required node selector term of the user's own affinity (terms
are ORed, expressions ANDed). GPU nodes are usually tainted `nvidia.com/gpu:NoSchedule`, hence
the default toleration.

The overlay (api.pod_template) is merged under the operator's fields: its validation has
already refused anything that would override them, and where both set the same map key
(nodeSelector) the operator's value wins.
"""

from __future__ import annotations

import copy
from typing import Any

from ..api.job import FineTuneJob
from .options import GpuPlacement

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_LABELS = {GpuPlacement.MEMORY: GPU_MEMORY_LABEL, GpuPlacement.PRODUCT: GPU_PRODUCT_LABEL}
GPU_MEMORY_FRACTION = 0.93
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_PRODUCTS: dict[str, int] = {
    "Tesla-T4": 16,
    "Tesla-V100-SXM2-16GB": 16,
    "Tesla-V100-PCIE-16GB": 16,
    "Tesla-V100-SXM2-32GB": 32,
    "NVIDIA-A10": 24,
    "NVIDIA-A10G": 24,
    "NVIDIA-L4": 24,
    "NVIDIA-GeForce-RTX-4090": 24,
    "NVIDIA-A100-PCIE-40GB": 40,
    "NVIDIA-A100-SXM4-40GB": 40,
    "NVIDIA-L40": 48,
    "NVIDIA-L40S": 48,
    "NVIDIA-RTX-A6000": 48,
    "NVIDIA-RTX-6000-Ada-Generation": 48,
    "NVIDIA-A100-80GB-PCIe": 80,
    "NVIDIA-A100-SXM4-80GB": 80,
    "NVIDIA-H100-PCIe": 80,
    "NVIDIA-H100-80GB-HBM3": 80,
    "NVIDIA-H100-NVL": 94,
    "NVIDIA-H200": 141,
    "NVIDIA-H200-NVL": 141,
    "NVIDIA-B200": 180,
}
"""GiB of each GPU by its `nvidia.com/gpu.product` label value (the device name with spaces as
hyphens, as GPU Feature Discovery and the GPU operator write it)."""


def gpu_memory_floor_mib(job: FineTuneJob) -> int:
    """The `nvidia.com/gpu.memory` value (MiB) a node's label must exceed."""
    return int(job.spec.resources.gpu_memory_bytes / 2**20 * GPU_MEMORY_FRACTION)


def products_with_memory(job: FineTuneJob) -> list[str]:
    """The known `nvidia.com/gpu.product` values whose GPUs have the job's `resources.gpuMemory`."""
    floor = gpu_memory_floor_mib(job)
    return sorted(name for name, gib in GPU_PRODUCTS.items() if gib * 1024 > floor)


def gpu_requirement(job: FineTuneJob, placement: GpuPlacement) -> dict[str, Any] | None:
    """The node selector requirement that places a GPU job, or None (`resource` placement)."""
    if placement == GpuPlacement.MEMORY:
        return {"key": GPU_MEMORY_LABEL, "operator": "Gt", "values": [str(gpu_memory_floor_mib(job))]}
    if placement == GpuPlacement.PRODUCT:
        # no known product is that large: a value no node has, so the pods wait and say why
        known = products_with_memory(job) or [f"none-known-with-{job.spec.resources.gpu_memory}"]
        return {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": known}
    return None


def placement_hint(label: str) -> str:
    """What to do when no node carries the GPU label a Pending pod requires."""
    other = "product or resource" if label == GPU_MEMORY_LABEL else "resource"
    return (
        f"the pods require the node label {label} (GPU Feature Discovery); on a cluster without it, "
        f"set the operator's GPU placement (chart value gpuPlacement) to {other}"
    )


def affinity(job: FineTuneJob, placement: GpuPlacement = GpuPlacement.MEMORY) -> dict[str, Any] | None:
    """The user's affinity with the GPU node requirement of `placement` ANDed into every required term."""
    overlay = job.spec.pod_template
    out: dict[str, Any] = copy.deepcopy(overlay.affinity) if overlay and overlay.affinity else {}
    requirement = gpu_requirement(job, placement) if job.spec.resources.gpus_per_node else None
    if requirement is not None:
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
