"""Which volumes a trainer pod mounts, derived from the URIs in the spec.

Every `pvc://claim/...` URI (model, dataset, output) mounts its claim at
`/mnt/pvc/<claim>`, the layout `finetune_trainer.storage.paths` resolves against; the output
claim is writable, the others read-only. The operator never creates or deletes those claims:
output data outlives the job. A hub model's download cache is the exception: each pod gets a
claim of its own from the StatefulSet's volumeClaimTemplates, deleted with the StatefulSet.
Without a hub model, s3:// inputs are mirrored into an emptyDir at the same place.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ..api.job import FineTuneJob
from ..api.model_cache import default_size
from ..api.model_uri import is_hub_uri
from ..api.storage_uri import MODEL_CACHE_DIR, PVC_ROOT, Scheme, StorageUri
from .identity import labels

SHM_SIZE = "8Gi"
MODEL_CACHE_VOLUME = "model-cache"
FALLBACK_CACHE_SIZE = "100Gi"
"""A cache claim's size when the plan has no model bytes (a plan made by an older operator)."""
DEFAULT_MIRROR_SIZE = "100Gi"
"""The emptyDir (and ephemeral-storage request) that mirrors s3:// inputs when `model.cache.size` is unset."""


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_LABEL = 63


def claim_volume_name(claim: str) -> str:
    """The pod volume of a claim: a DNS label (<= 63 characters, no dots, no trailing '-').

    Claim names are DNS subdomains of up to 253 characters, so `pvc-<claim>` is used only when
    it is already a valid label; otherwise the readable part is cut and a hash of the whole
    claim name keeps two long claims that share a prefix apart.
    """
    plain = f"pvc-{claim}"
    if len(plain) <= _MAX_LABEL and _DNS_LABEL.fullmatch(plain):
        return plain
    digest = hashlib.sha256(claim.encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9-]", "-", claim.lower())[: _MAX_LABEL - len("pvc--") - len(digest)]
    readable = readable.strip("-")
    return f"pvc-{readable}-{digest}" if readable else f"pvc-{digest}"


def claim_of(uri: str) -> str | None:
    parsed = StorageUri.of(uri)
    return parsed.claim if parsed.scheme is Scheme.CLAIM else None


def local_path(uri: str) -> str | None:
    """Where a pvc:// or path URI appears inside the container."""
    parsed = StorageUri.of(uri)
    if parsed.scheme is Scheme.CLAIM:
        rest = parsed.path.lstrip("/")
        return f"{PVC_ROOT}/{parsed.claim}" + (f"/{rest}" if rest else "")
    return parsed.path if parsed.scheme is Scheme.PATH else None


def is_hub_model(uri: str) -> bool:
    """A hub id (`org/name`, `hf://org/name`, with or without `@revision`): downloaded at run time, into the cache."""
    return is_hub_uri(uri)


def needs_model_cache(job: FineTuneJob) -> bool:
    """A hub model is downloaded, and s3:// inputs (model, tokenizer, data) mirrored, into the cache once per pod."""
    return is_hub_model(job.spec.model.uri) or any(field != "spec.output.uri" for field in job.spec.s3_uris)


def shared_cache_claim(job: FineTuneJob) -> str | None:
    """The one claim every pod downloads into (`model.cache.claimName`), if the job names one and has a cache."""
    cache = job.spec.model.cache
    return cache.claim_name if needs_model_cache(job) and cache is not None else None


def model_cache_size(job: FineTuneJob) -> str | None:
    """The emptyDir size (and ephemeral-storage request) of an s3:// mirror without a hub model; None otherwise.

    A hub model's cache is a claim (`model_cache_template` or the shared one), not ephemeral storage.
    """
    if is_hub_model(job.spec.model.uri) or not needs_model_cache(job) or shared_cache_claim(job) is not None:
        return None
    cache = job.spec.model.cache
    return str(cache.size) if cache is not None and cache.size is not None else DEFAULT_MIRROR_SIZE


def model_cache_template(job: FineTuneJob, model_bytes: int | None, storage_class: str | None) -> dict[str, Any] | None:
    """The per-pod cache claim of a hub model (a StatefulSet volumeClaimTemplate), None without one.

    Each ordinal gets its own ReadWriteOnce claim and gets it back after a gang restart (the pods
    are deleted, the claims are not), so a restarted gang downloads nothing it already has. Sized
    from the model's files (`status.plan.modelBytes`) unless `model.cache.size` is set.
    """
    if not is_hub_model(job.spec.model.uri) or shared_cache_claim(job) is not None:
        return None
    cache = job.spec.model.cache
    if cache is not None and cache.size is not None:
        size = str(cache.size)
    else:
        size = default_size(model_bytes) if model_bytes else FALLBACK_CACHE_SIZE
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    storage_class = (cache.storage_class_name if cache is not None else None) or storage_class
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": MODEL_CACHE_VOLUME, "labels": labels(job, "model-cache")},
        "spec": spec,
    }


def _model_cache_volume(job: FineTuneJob) -> dict[str, Any] | None:
    """The pod volume of the cache: the shared claim, or the s3:// mirror's emptyDir (a hub model's
    per-pod claim comes from the StatefulSet's volumeClaimTemplates instead)."""
    shared = shared_cache_claim(job)
    if shared is not None:
        return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": shared}}
    size = model_cache_size(job)
    return {"name": MODEL_CACHE_VOLUME, "emptyDir": {"sizeLimit": size}} if size is not None else None


def claims(job: FineTuneJob) -> dict[str, bool]:
    """Claim name → read-only? (a claim used for output is writable)."""
    spec = job.spec
    out: dict[str, bool] = {}
    for uri, read_only in ((spec.model.uri, True), (spec.dataset.uri, True), (spec.output.uri, False)):
        claim = claim_of(uri)
        if claim is not None:
            out[claim] = out.get(claim, True) and read_only
    for extra in (spec.model.tokenizer, spec.model.adapter, spec.dataset.validation_uri):
        if extra and (claim := claim_of(extra)):
            out.setdefault(claim, True)
    return out


def volumes(job: FineTuneJob, config_map: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    for claim, read_only in sorted(claims(job).items()):
        result.append(
            {"name": claim_volume_name(claim), "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
        )
    if job.spec.deepspeed.nvme_path:
        result.append({"name": "nvme", "emptyDir": {}})
    cache = _model_cache_volume(job)
    if cache is not None:
        result.append(cache)
    return result


def volume_mounts(job: FineTuneJob, config_dir: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = [
        {"name": "config", "mountPath": config_dir, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    for claim, read_only in sorted(claims(job).items()):
        result.append({"name": claim_volume_name(claim), "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": read_only})
    if job.spec.deepspeed.nvme_path:
        result.append({"name": "nvme", "mountPath": job.spec.deepspeed.nvme_path})
    if needs_model_cache(job):  # the shared claim, the pod's own from volumeClaimTemplates, or the s3:// mirror
        result.append({"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR})
    return result
