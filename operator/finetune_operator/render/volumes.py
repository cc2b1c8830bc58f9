"""Which volumes a trainer pod mounts, derived from the URIs in the spec.

Every `pvc://claim/...` URI (model, dataset, output) mounts its claim at
`/mnt/pvc/<claim>`, the layout `finetune_trainer.paths` resolves against; the output
claim is writable, the others read-only. The operator never creates or deletes a claim:
output data outlives the job.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ..api.job import FineTuneJob
from ..api.spec import DEFAULT_MODEL_CACHE_SIZE

PVC_ROOT = "/mnt/pvc"
SHM_SIZE = "8Gi"
MODEL_CACHE_DIR = "/var/cache/ftjob"
"""Where a hub model is downloaded (HF_HOME below it), once per pod before the ranks start."""


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
    if not uri.startswith("pvc://"):
        return None
    return uri[len("pvc://") :].split("/", 1)[0]


def local_path(uri: str) -> str | None:
    """Where a pvc:// or path URI appears inside the container."""
    claim = claim_of(uri)
    if claim is not None:
        rest = uri[len("pvc://") + len(claim) :].lstrip("/")
        return f"{PVC_ROOT}/{claim}" + (f"/{rest}" if rest else "")
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return uri if uri.startswith("/") else None


def is_hub_model(uri: str) -> bool:
    """A hub id (`org/name`, `hf://org/name`): downloaded at run time, so it needs the cache."""
    return not uri.startswith(("pvc://", "file://", "/", "builtin://", "s3://"))


def needs_model_cache(job: FineTuneJob) -> bool:
    """A hub model, or s3:// inputs (model, tokenizer, data), are copied into the cache once per pod."""
    return is_hub_model(job.spec.model.uri) or any(field != "spec.output.uri" for field in job.spec.s3_uris)


def model_cache_size(job: FineTuneJob) -> str | None:
    """The emptyDir size (and ephemeral-storage request) of the model cache; None without one."""
    if not needs_model_cache(job):
        return None
    cache = job.spec.model.cache
    if cache is not None and cache.claim_name is not None:
        return None
    size = cache.size if cache is not None and cache.size is not None else DEFAULT_MODEL_CACHE_SIZE
    return str(size)


def _model_cache_volume(job: FineTuneJob) -> dict[str, Any] | None:
    if not needs_model_cache(job):
        return None
    cache = job.spec.model.cache
    if cache is not None and cache.claim_name is not None:
        return {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.claim_name}}
    return {"name": "model-cache", "emptyDir": {"sizeLimit": model_cache_size(job)}}


def claims(job: FineTuneJob) -> dict[str, bool]:
    """Claim name → read-only? (a claim used for output is writable)."""
    spec = job.spec
    out: dict[str, bool] = {}
    for uri, read_only in ((spec.model.uri, True), (spec.dataset.uri, True), (spec.output.uri, False)):
        claim = claim_of(uri)
        if claim is not None:
            out[claim] = out.get(claim, True) and read_only
    for extra in (spec.model.tokenizer, spec.dataset.validation_uri):
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
    if needs_model_cache(job):
        result.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    return result
