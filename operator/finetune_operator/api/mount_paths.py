"""Where the trainer container's filesystem may take a mount the user chooses (`deepspeed.nvmePath`).

An emptyDir mounted over `/`, `/usr` or the operator's own mounts (config, shared memory,
claims, model cache) hides what the container needs to start, so the pod fails far from the
field that caused it. One list of places, checked by the apiserver (CEL, from `cel_rule`) and
by `ftjob validate` (pydantic, from `problem`), so both say the same thing.
"""

from __future__ import annotations

from .pod_template import OWNED_MOUNT_PATHS

SYSTEM_DIRS = ("bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "proc", "run", "sbin", "sys", "usr")
"""Top-level directories of the image that a mount must not shadow."""
IMAGE_PATHS = ("/opt/ftjob",)
"""The trainer's own install (the virtualenv of the image)."""
FORBIDDEN = (*OWNED_MOUNT_PATHS, *IMAGE_PATHS)

MESSAGE = (
    "must be a dedicated directory such as /mnt/nvme or /local_nvme: not /, a '.' or '..' segment, "
    f"a system directory (/{', /'.join(SYSTEM_DIRS)}), or a path the operator or image uses "
    f"({', '.join(FORBIDDEN)}) or one of their parents"
)


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def problem(path: str) -> str | None:
    """Why `path` cannot take the mount, or None."""
    segments = path.strip("/").split("/")
    if path.rstrip("/") == "" or any(s in (".", "..", "") for s in segments):
        return MESSAGE
    if segments[0] in SYSTEM_DIRS:
        return MESSAGE
    clean = "/" + "/".join(segments)
    for owned in FORBIDDEN:
        if clean == owned or clean.startswith(owned + "/") or clean in _parents(owned):
            return MESSAGE
    return None


def cel_rule() -> str:
    """The same check as `problem`, for the CRD (`self` is the path string)."""
    ancestors = sorted({p.lstrip("/") for owned in FORBIDDEN for p in _parents(owned)})
    under = "|".join(p.lstrip("/") for p in FORBIDDEN)
    return (
        "self.matches('^(/[^/]+)+/?$') && !self.matches('(^|/)[.][.]?(/|$)') "
        f"&& !self.matches('^/({'|'.join(SYSTEM_DIRS)})(/|$)') "
        f"&& !self.matches('^/({under})(/|$)') "
        f"&& !self.matches('^/({'|'.join(ancestors)})/?$')"
    )
