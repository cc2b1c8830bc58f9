"""`spec.podTemplate`: what users may add to the trainer pods, and what they may not touch.

Real clusters need things the operator cannot guess: RDMA devices (`rdma/*`,
`nvidia.com/hostdev`, EFA), network attachment annotations, `IPC_LOCK` for pinned memory,
a runtime class, a scheduler, pull secrets, extra volumes. The overlay merges *under* the
fields the operator owns: its labels and annotations, the resources it derives from
`spec.resources` (cpu, memory, nvidia.com/gpu, ephemeral-storage), its volumes and mount
paths. A field that would override one of those is rejected here, naming the field, so
the apiserver-facing message says what to change instead of the pod silently differing.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import (
    ABSOLUTE_PATH_PATTERN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    ApiModel,
    LabelValue,
    Quantity,
    check_node_selector,
)
from .storage_uri import MODEL_CACHE_DIR, PVC_ROOT
from .toleration import Toleration

OWNED_LABEL_PREFIXES = ("app.kubernetes.io/", "finetune.dev/", "statefulset.kubernetes.io/", "apps.kubernetes.io/")
"""Label and annotation prefixes the operator (or the StatefulSet controller) sets."""

OWNED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi")
"""Resources the operator derives from spec.resources (and the model cache)."""

OWNED_VOLUMES = ("config", "shm", "nvme", "model-cache")
"""Volume names the operator uses; claims from pvc:// URIs are `pvc-<claim>`."""

OWNED_MOUNT_PATHS = ("/etc/ftjob", "/dev/shm", PVC_ROOT, MODEL_CACHE_DIR)
"""Mount paths (and everything under them) the operator uses."""

Capability = Literal["IPC_LOCK", "SYS_RESOURCE", "NET_RAW", "NET_ADMIN", "SYS_PTRACE", "NET_BIND_SERVICE"]
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
"""A label key or resource name: an optional DNS prefix and a name (checked in Python: a
pattern on map keys is not a structural CRD schema)."""
LabelKey = Annotated[str, Field(max_length=317)]
ResourceName = Annotated[str, Field(max_length=317)]
FreeForm = Annotated[dict[str, Any], Field(json_schema_extra={"x-ftjob-preserve-unknown": True})]


def token_volume_fields(overlay: PodTemplateOverlay | None) -> list[str]:
    """Where `overlay` mounts a projected service-account token (`spec.podTemplate.volumes[i]...`).

    Trainer pods get no apiserver token (`automountServiceAccountToken: false`); a projected
    `serviceAccountToken` source would hand them one anyway, for the job's service account
    (`objectStorage.serviceAccountName`) or the namespace's default. The installation decides
    whether that is allowed (`SchedulingPolicy`): the volumes are free-form, which the
    apiserver's CEL cannot look into."""
    found = []
    for i, volume in enumerate((overlay.volumes or []) if overlay else []):
        projected = volume.get("projected")
        sources = projected.get("sources") if isinstance(projected, dict) else None
        for j, source in enumerate(sources if isinstance(sources, list) else []):
            if isinstance(source, dict) and "serviceAccountToken" in source:
                found.append(f"spec.podTemplate.volumes[{i}].projected.sources[{j}].serviceAccountToken")
    return found


def _qualified(key: str) -> None:
    if not QUALIFIED_NAME.fullmatch(key):
        raise ValueError(f"{key!r} is not a valid name (an optional DNS prefix and '/', then letters, digits, -_.)")


def _owned_prefix(key: str) -> str | None:
    return next((p for p in OWNED_LABEL_PREFIXES if key.startswith(p)), None)


def _is_owned_path(path: str) -> bool:
    clean = path.rstrip("/") or "/"
    return any(
        clean == p or clean.startswith(p + "/") or p.startswith(clean + "/") or clean == "/" for p in OWNED_MOUNT_PATHS
    )


class OverlayMetadata(ApiModel):
    """Labels and annotations added to every trainer pod (e.g. a Multus network annotation)."""

    labels: dict[LabelKey, Annotated[str, Field(max_length=63)]] | None = None
    annotations: dict[LabelKey, Annotated[str, Field(max_length=65536)]] | None = None

    @field_validator("labels", "annotations", mode="after")
    @classmethod
    def _not_owned(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            _qualified(key)
            prefix = _owned_prefix(key)
            if prefix is not None:
                raise ValueError(f"key {key!r} is owned by the operator (prefix {prefix}); choose another prefix")
        return value


class VolumeMount(ApiModel):
    """A mount of one of `podTemplate.volumes` in the trainer container."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
    mount_path: Annotated[str, Field(min_length=1, max_length=512, pattern=ABSOLUTE_PATH_PATTERN)]
    read_only: bool | None = None
    sub_path: Annotated[str, Field(max_length=512)] | None = None

    @field_validator("mount_path", mode="after")
    @classmethod
    def _not_owned_path(cls, value: str) -> str:
        if _is_owned_path(value):
            raise ValueError(f"{value} overlaps a path the operator mounts ({', '.join(OWNED_MOUNT_PATHS)})")
        return value


class Capabilities(ApiModel):
    add: Annotated[list[Capability], Field(max_length=8)] | None = Field(
        default=None, description="Linux capabilities added to the trainer container (all others stay dropped)."
    )


class LocalObjectReference(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]


class PodTemplateOverlay(ApiModel):
    """Additions to the trainer pods, merged under the fields the operator owns."""

    metadata: OverlayMetadata | None = Field(default=None, description="Extra pod labels and annotations.")
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = Field(
        default=None, description="Extra tolerations (core API form), after the operator's and spec.resources'."
    )
    affinity: FreeForm | None = Field(
        default=None,
        description="Pod affinity (core API form). The operator's GPU-memory node requirement is added to every "
        "required node selector term.",
    )
    node_selector: dict[LabelKey, LabelValue] | None = Field(
        default=None,
        description="Extra node labels the pods must match (spec.resources.nodeSelector wins on a clash).",
    )
    _node_selector_keys = field_validator("node_selector", mode="after")(check_node_selector)
    resources: dict[ResourceName, Quantity] | None = Field(
        default=None,
        description="Extra resources of the trainer container, requested and limited alike, e.g. `rdma/ib: 1`, "
        "`nvidia.com/hostdev: 8`, `vpc.amazonaws.com/efa: 32`. cpu, memory, nvidia.com/gpu and ephemeral-storage "
        "come from spec.resources.",
    )
    volumes: Annotated[list[FreeForm], Field(max_length=32)] | None = Field(
        default=None, description="Extra pod volumes (core API form, each with a name)."
    )
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=32)] | None = Field(
        default=None, description="Mounts of those volumes in the trainer container."
    )
    runtime_class_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = None
    scheduler_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = None
    priority_class_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = None
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] | None = None
    capabilities: Capabilities | None = None

    @field_validator("resources", mode="after")
    @classmethod
    def _no_owned_resources(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in value or {}:
            _qualified(key)
            if key in OWNED_RESOURCES:
                raise ValueError(f"{key!r} is set by the operator from spec.resources; set it there")
        return value

    @field_validator("volumes", mode="after")
    @classmethod
    def _named_volumes(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        seen: set[str] = set()
        for i, volume in enumerate(value or []):
            name = volume.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"volumes[{i}] needs a name")
            if name in OWNED_VOLUMES or name.startswith("pvc-"):
                raise ValueError(
                    f"volumes[{i}].name {name!r} is owned by the operator ({', '.join(OWNED_VOLUMES)}, pvc-*)"
                )
            if name in seen:
                raise ValueError(f"volumes[{i}].name {name!r} is used twice")
            seen.add(name)
        return value

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PodTemplateOverlay:
        names = {v["name"] for v in self.volumes or []}
        for i, mount in enumerate(self.volume_mounts or []):
            if mount.name not in names:
                raise ValueError(f"volumeMounts[{i}].name {mount.name!r} is not one of podTemplate.volumes")
        return self
