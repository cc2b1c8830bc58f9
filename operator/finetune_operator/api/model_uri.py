"""What a `model.uri` names, parsed once for the operator, the inspector and the trainer.

A hub id is `org/name` or `hf://org/name`, optionally pinned to a revision with `@revision`
(`hf://Qwen/Qwen3-8B@main`, `meta-llama/Llama-3.2-1B@<commit>`), or with `model.revision`
(the apiserver refuses both at once); a claim is `pvc://claim/path`. Everything that reads a
model (the operator planning it, the inspector pod, each trainer pod downloading it) parses the
uri here, so they all agree on which repo and which revision a job means.
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL_PREFIXES = ("pvc://", "file://", "/", "builtin://", "s3://")
"""Prefixes of every model uri that is not a hub id (s3:// objects are mirrored by the pod, not downloaded)."""
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class HubModel:
    """A model repository on the hub (or a mirror) and the revision the job pins, if any."""

    repo: str
    revision: str | None = None

    @property
    def revision_or_default(self) -> str:
        return self.revision or DEFAULT_REVISION

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class ClaimModel:
    """A model folder on a PersistentVolumeClaim: `pvc://<claim>/<path>`."""

    claim: str
    path: str

    def __str__(self) -> str:
        return f"pvc://{self.claim}/{self.path}".rstrip("/")


def is_hub_uri(uri: str) -> bool:
    """A hub id (`org/name`, `hf://org/name`, either with `@revision`): downloaded at run time."""
    return not uri.startswith(LOCAL_PREFIXES)


def hub_model(uri: str, revision: str | None = None) -> HubModel | None:
    """The repo and revision of a hub uri (`revision`: the spec's `model.revision`), None otherwise."""
    if not is_hub_uri(uri):
        return None
    repo, _, pinned = uri.removeprefix("hf://").partition("@")
    return HubModel(repo, pinned or revision or None)


def claim_model(uri: str) -> ClaimModel | None:
    """The claim and the folder inside it of a `pvc://` uri, None otherwise."""
    if not uri.startswith("pvc://"):
        return None
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return ClaimModel(claim, path.strip("/"))
