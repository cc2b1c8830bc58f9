"""Where URIs of a FineTuneJob live on the filesystem of a trainer pod.

This is the one place that knows the mapping the operator's pod spec implements:
`pvc://claim/path` is mounted at `/mnt/pvc/<claim>/<path>` (root overridable with
FTJOB_PVC_ROOT for tests), `file:///x` and `/x` are paths, `s3://bucket/key` is mirrored before the ranks start into
`<FTJOB_S3_MIRROR>/bucket/key` (see `s3_inputs`), `builtin://name` is generated in code, and
anything else is a hub id. The output folder layout (checkpoints, adapter,
completion marker) is defined here too so the entrypoint and the ranks agree.
"""

from __future__ import annotations

import os
from pathlib import Path

from finetune_operator.api.pod_env import PodEnv

PVC_ROOT = "/mnt/pvc"
S3_MIRROR = "/var/cache/ftjob/s3"
"""Where `s3://` inputs are downloaded in a pod (the model cache volume); FTJOB_S3_MIRROR overrides it."""
COMPLETION_MARKER = "COMPLETED.json"
CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
MODEL = "model"
MERGED = "merged"
CACHE = ".cache"


def pvc_root() -> Path:
    return Path(os.environ.get(PodEnv.FTJOB_PVC_ROOT, PVC_ROOT))


def s3_mirror() -> Path:
    return Path(os.environ.get(PodEnv.FTJOB_S3_MIRROR, S3_MIRROR))


def resolve_uri(uri: str) -> str | None:
    """Local path of a URI, `builtin://...` unchanged, or None for a hub id."""
    if uri.startswith("builtin://"):
        return uri
    if uri.startswith("pvc://"):
        claim, _, rest = uri[len("pvc://") :].partition("/")
        return str(pvc_root() / claim / rest) if rest else str(pvc_root() / claim)
    if uri.startswith("file://"):
        return uri[len("file://") :]
    if uri.startswith("/"):
        return uri
    if uri.startswith("s3://"):
        return str(s3_mirror() / uri[len("s3://") :].rstrip("/"))
    return None


def output_dir(output_uri: str) -> Path:
    """The job's output folder: FTJOB_OUTPUT_DIR (set by the operator and by `ftjob run`) wins.

    With output on `s3://` this is the pod's local staging folder (its scratch volume), which
    `s3_checkpoints` uploads from."""
    explicit = os.environ.get(PodEnv.FTJOB_OUTPUT_DIR)
    if explicit:
        return Path(explicit)
    if output_uri.startswith("s3://"):
        raise ValueError(
            f"output.uri {output_uri!r} is on object storage: FTJOB_OUTPUT_DIR must name a local staging folder"
        )
    local = resolve_uri(output_uri)
    if local is None or local.startswith("builtin://"):
        raise ValueError(f"output.uri {output_uri!r} is not a local path or pvc:// URI")
    return Path(local)


def completion_marker(out: Path) -> Path:
    return out / COMPLETION_MARKER
