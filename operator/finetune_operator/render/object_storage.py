"""What a trainer pod gets for the job's `s3://` URIs: connection env, credentials, volumes.

- Connection: `spec.objectStorage` field by field over the operator's defaults (the chart's
  `objectStorage` values), as FTJOB_S3_* env the trainer's client reads.
- Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY through `secretKeyRef` only (the
  operator never reads the Secret), and the Secret's *name* so the trainer can say which keys
  were refused; or, for workload identity, the pod's `serviceAccountName`.
- Volumes: a CA bundle ConfigMap (AWS_CA_BUNDLE points into it), a scratch emptyDir the plan
  sizes when the output is on s3:// (the pod's staging folder, FTJOB_OUTPUT_DIR), and the
  model cache that s3:// models and data are mirrored into (FTJOB_S3_MIRROR).

A user's own env entry of the same name wins (and is then not duplicated, which the apiserver
would refuse).
"""

from __future__ import annotations

from typing import Any

from ..api.job import FineTuneJob
from ..api.object_storage import ObjectStorageSpec
from ..api.pod_env import PodEnv
from ..api.storage_uri import MIRROR_SUBDIR, is_s3
from .env_entries import secret_entry, value_entry
from .options import RenderOptions

SCRATCH_DIR = "/var/lib/ftjob/scratch"
OUTPUT_STAGING_DIR = f"{SCRATCH_DIR}/output"
CA_DIR = "/etc/ftjob/s3-ca"
CA_FILE = "ca.crt"


def uses_s3(job: FineTuneJob) -> bool:
    return bool(job.spec.s3_uris)


def output_on_s3(job: FineTuneJob) -> bool:
    return is_s3(job.spec.output.uri)


def inputs_on_s3(job: FineTuneJob) -> bool:
    return any(field != "spec.output.uri" for field in job.spec.s3_uris)


def effective(job: FineTuneJob, options: RenderOptions) -> ObjectStorageSpec:
    """The job's settings over the operator's defaults, field by field."""
    own = job.spec.object_storage or ObjectStorageSpec()
    base = options.object_storage
    return own.model_copy(
        update={
            "endpoint": own.endpoint or base.endpoint,
            "region": own.region or base.region,
            "path_style": own.path_style if own.path_style is not None else base.path_style,
            "ca_bundle": own.ca_bundle or base.ca_bundle,
        }
    )


def env(job: FineTuneJob, options: RenderOptions, mirror_root: str) -> list[dict[str, Any]]:
    if not uses_s3(job):
        return []
    store = effective(job, options)
    values: dict[PodEnv, str | None] = {
        PodEnv.FTJOB_S3_ENDPOINT: store.endpoint,
        PodEnv.FTJOB_S3_REGION: store.region,
        PodEnv.FTJOB_S3_PATH_STYLE: None if store.path_style is None else str(store.path_style).lower(),
        PodEnv.FTJOB_S3_RETRY_SECONDS: str(store.retry_timeout_seconds) if store.retry_timeout_seconds else None,
        PodEnv.FTJOB_S3_MIRROR: f"{mirror_root}/{MIRROR_SUBDIR}",
        PodEnv.AWS_CA_BUNDLE: f"{CA_DIR}/{CA_FILE}" if store.ca_bundle else None,
        PodEnv.FTJOB_S3_CREDENTIALS_SECRET: store.credentials.secret_name if store.credentials else None,
    }
    out: list[dict[str, Any]] = [value_entry(k, v) for k, v in values.items() if v is not None]
    if store.credentials is not None:
        ref = store.credentials
        for name, key in (
            (PodEnv.AWS_ACCESS_KEY_ID, ref.access_key_id_key),
            (PodEnv.AWS_SECRET_ACCESS_KEY, ref.secret_access_key_key),
        ):
            out.append(secret_entry(name, ref.secret_name, key))
    user = {e.name for e in job.spec.env or []}
    return [e for e in out if e["name"] not in user]


def volumes(job: FineTuneJob, options: RenderOptions, scratch_bytes: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if output_on_s3(job):
        out.append({"name": "scratch", "emptyDir": {"sizeLimit": f"{scratch_bytes // 2**30}Gi"}})
    ca = effective(job, options).ca_bundle if uses_s3(job) else None
    if ca is not None:
        out.append({"name": "s3-ca", "configMap": {"name": ca.name, "items": [{"key": ca.key, "path": CA_FILE}]}})
    return out


def volume_mounts(job: FineTuneJob, options: RenderOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if output_on_s3(job):
        out.append({"name": "scratch", "mountPath": SCRATCH_DIR})
    if uses_s3(job) and effective(job, options).ca_bundle is not None:
        out.append({"name": "s3-ca", "mountPath": CA_DIR, "readOnly": True})
    return out


def service_account(job: FineTuneJob) -> str | None:
    """The trainer pods' service account for workload identity, if the job names one."""
    store = job.spec.object_storage
    return store.service_account_name if store is not None and uses_s3(job) else None
