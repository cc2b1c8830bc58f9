"""Which volumes a trainer pod mounts, derived from the URIs in the spec.

Every `pvc://claim/...` URI (model, dataset, output) mounts its claim at
`/mnt/pvc/<claim>`, the layout `finetune_trainer.paths` resolves against; the output
claim is writable, the others read-only. The operator never creates or deletes a claim:
output data outlives the job.
"""

from __future__ import annotations

from typing import Any

from ..api.job import FineTuneJob
from ..api.spec import DEFAULT_MODEL_CACHE_SIZE

PVC_ROOT = "/mnt/pvc"
SHM_SIZE = "8Gi"
MODEL_CACHE_DIR = "/var/cache/ftjob"
"""Where a hub model is downloaded (HF_HOME below it), once per pod before the ranks start."""


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
    return not uri.startswith(("pvc://", "file://", "/", "builtin://"))


def model_cache_size(job: FineTuneJob) -> str | None:
    """The emptyDir size (and ephemeral-storage request) of the model cache; None without one."""
    if not is_hub_model(job.spec.model.uri):
        return None
    cache = job.spec.model.cache
    if cache is not None and cache.claim_name is not None:
        return None
    size = cache.size if cache is not None and cache.size is not None else DEFAULT_MODEL_CACHE_SIZE
    return str(size)


def _model_cache_volume(job: FineTuneJob) -> dict[str, Any] | None:
    if not is_hub_model(job.spec.model.uri):
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
    if spec.model.tokenizer and (claim := claim_of(spec.model.tokenizer)):
        out.setdefault(claim, True)
    return out


def volumes(job: FineTuneJob, config_map: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    for claim, read_only in sorted(claims(job).items()):
        result.append(
            {"name": f"pvc-{claim}"[:63], "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
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
        result.append({"name": f"pvc-{claim}"[:63], "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": read_only})
    if job.spec.deepspeed.nvme_path:
        result.append({"name": "nvme", "mountPath": job.spec.deepspeed.nvme_path})
    if is_hub_model(job.spec.model.uri):
        result.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    return result
