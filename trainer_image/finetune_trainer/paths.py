"""Where URIs of a FineTuneJob live on the filesystem of a trainer pod.

This is the one place that knows the mapping the operator's pod spec implements:
`pvc://claim/path` is mounted at `/mnt/pvc/<claim>/<path>` (root overridable with
FTJOB_PVC_ROOT for tests), `file:///x` and `/x` are paths, `builtin://name` is generated
in code, and anything else is a hub id. The output folder layout (checkpoints, adapter,
completion marker) is defined here too so the entrypoint and the ranks agree.
"""

from __future__ import annotations

import os
from pathlib import Path

PVC_ROOT = "/mnt/pvc"
COMPLETION_MARKER = "COMPLETED.json"
CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
MODEL = "model"
MERGED = "merged"
CACHE = ".cache"


def pvc_root() -> Path:
    return Path(os.environ.get("FTJOB_PVC_ROOT", PVC_ROOT))


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
    return None


def output_dir(output_uri: str) -> Path:
    """The job's output folder: FTJOB_OUTPUT_DIR (set by the operator and by `ftjob run`) wins."""
    explicit = os.environ.get("FTJOB_OUTPUT_DIR")
    if explicit:
        return Path(explicit)
    local = resolve_uri(output_uri)
    if local is None or local.startswith("builtin://"):
        raise ValueError(f"output.uri {output_uri!r} is not a local path or pvc:// URI")
    return Path(local)


def completion_marker(out: Path) -> Path:
    return out / COMPLETION_MARKER
