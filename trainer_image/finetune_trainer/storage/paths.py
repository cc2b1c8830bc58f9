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
from finetune_operator.api.storage_uri import PVC_ROOT, S3_MIRROR, Scheme, StorageUri

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
    parsed = StorageUri.of(uri)
    if parsed.scheme is Scheme.BUILTIN:
        return uri
    if parsed.scheme is Scheme.CLAIM:
        rest = parsed.path
        return str(pvc_root() / parsed.claim / rest) if rest else str(pvc_root() / parsed.claim)
    if parsed.scheme is Scheme.PATH:
        return parsed.path
    if parsed.scheme is Scheme.S3:
        return str(mirror_folder(parsed))
    return None


def mirror_folder(uri: StorageUri, root: Path | None = None) -> Path:
    """Where the mirror of an `s3://` input lives: `<root>/bucket/key` (root: `s3_mirror()`).

    `s3_inputs` writes the copy here and `resolve_uri` sends the ranks here."""
    return (s3_mirror() if root is None else root) / f"{uri.bucket}/{uri.key}".rstrip("/")


def output_dir(output_uri: str) -> Path:
    """The job's output folder: FTJOB_OUTPUT_DIR (set by the operator and by `ftjob run`) wins.

    With output on `s3://` this is the pod's local staging folder (its scratch volume), which
    `s3_checkpoints` uploads from."""
    explicit = os.environ.get(PodEnv.FTJOB_OUTPUT_DIR)
    if explicit:
        return Path(explicit)
    if StorageUri.of(output_uri).scheme is Scheme.S3:
        raise ValueError(
            f"output.uri {output_uri!r} is on object storage: FTJOB_OUTPUT_DIR must name a local staging folder"
        )
    local = resolve_uri(output_uri)
    if local is None or StorageUri.of(local).scheme is Scheme.BUILTIN:
        raise ValueError(f"output.uri {output_uri!r} is not a local path or pvc:// URI")
    return Path(local)


def result_uri(output_uri: str, out: Path, folder: Path) -> str:
    """What a result folder (`folder`, written under the job's output folder `out`) is called
    outside the pod: `pvc://claim/path` when `out` is the mount of an output claim, else
    `file:///abs/path` (a path output, or `ftjob run`'s local folder). An `s3://` output's URIs
    come from its upload (`s3_checkpoints.S3Output.publish_results`), not from here."""
    parsed = StorageUri.of(output_uri)
    if parsed.scheme is Scheme.CLAIM:
        mount = pvc_root() / parsed.claim
        claim_folder = mount / parsed.path.strip("/") if parsed.path.strip("/") else mount
        if out.resolve() == claim_folder.resolve() and folder.resolve().is_relative_to(mount.resolve()):
            return f"pvc://{parsed.claim}/{folder.resolve().relative_to(mount.resolve()).as_posix()}"
    return f"file://{folder.resolve().as_posix()}"


def result_folder(uri: str) -> Path | None:
    """Where a result URI (`result_uri`'s `pvc://` or `file://`) is on this pod's filesystem; None
    for `s3://` (uploaded, not here)."""
    parsed = StorageUri.of(uri)
    if parsed.scheme in (Scheme.CLAIM, Scheme.PATH):
        return Path(str(resolve_uri(uri)))
    return None


def completion_marker(out: Path) -> Path:
    return out / COMPLETION_MARKER


def is_builtin(uri: str) -> bool:
    return StorageUri.of(uri).scheme is Scheme.BUILTIN


def builtin_name(uri: str) -> str:
    """The name of a `builtin://` uri ("" for any other)."""
    return StorageUri.of(uri).name
