"""Operator-wide settings that shape what is rendered (not part of any one job)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ..api.object_storage import ObjectStorageSpec

DEFAULT_TRAINER_IMAGE = "ghcr.io/finetune-operator/trainer:0.1.0"
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"
DEFAULT_DOWNLOAD_TIMEOUT_SECONDS = 7200
"""A pod's whole model download (141 GB at ~20 MB/s); the ranks' own rendezvous timeout starts after it."""


class GpuPlacement(StrEnum):
    """How trainer pods find GPUs with the memory the plan assumed (`render.placement`)."""

    MEMORY = "memory"
    """Node affinity on GPU Feature Discovery's `nvidia.com/gpu.memory` label (the default)."""
    PRODUCT = "product"
    """Node affinity on `nvidia.com/gpu.product`: the known products with that much memory."""
    RESOURCE = "resource"
    """The device plugin's `nvidia.com/gpu` resource alone: no GPU label is required (clusters
    without GFD; the cluster's own node pools or the job's podTemplate say which GPUs)."""


@dataclass(frozen=True)
class RenderOptions:
    """Knobs the operator's flags set; the defaults are what a Helm install uses."""

    trainer_image: str = DEFAULT_TRAINER_IMAGE
    image_pull_policy: str = "IfNotPresent"
    master_port: int = 29500
    metrics_port: int = 9400
    pod_monitor: bool = False
    run_as_user: int = 1000
    termination_grace_seconds: int = 60
    default_queue_name: str | None = None
    """Kueue LocalQueue for jobs that name none (None: such jobs are not queued)."""
    default_tracking_uri: str | None = None
    """MLflow tracking server for jobs that name none (None: such jobs are not tracked)."""
    object_storage: ObjectStorageSpec = field(default_factory=ObjectStorageSpec)
    """Connection defaults for jobs' s3:// URIs (endpoint, region, pathStyle, caBundle); a job's
    `spec.objectStorage` overrides them field by field."""
    hub_endpoint: str | None = None
    """The hub or mirror trainer pods and inspector pods download from (HF_ENDPOINT); None: the library's default."""
    model_cache_storage_class: str | None = None
    """StorageClass of the per-pod model cache claims (None: the cluster's default class)."""
    download_timeout_seconds: int = DEFAULT_DOWNLOAD_TIMEOUT_SECONDS
    gpu_placement: GpuPlacement = GpuPlacement.MEMORY
    """Which node labels the GPU placement requires (`--gpu-placement`, the chart's `gpuPlacement`)."""
