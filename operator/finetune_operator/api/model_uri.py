"""What a `model.uri` names, parsed once for the operator, the inspector and the trainer.

A hub id is `org/name` or `hf://org/name`, optionally pinned to a revision with `@revision`
(`hf://Qwen/Qwen3-8B@main`, `meta-llama/Llama-3.2-1B@<commit>`), or with `model.revision`
(the apiserver refuses both at once); a claim is `pvc://claim/path`. Everything that reads a
model (the operator planning it, the inspector pod, each trainer pod downloading it) parses the
uri here, so they all agree on which repo and which revision a job means.
"""

from __future__ import annotations

from dataclasses import dataclass

from .storage_uri import Scheme, StorageUri

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
    return StorageUri.of(uri).scheme is Scheme.HUB


def hub_model(uri: str, revision: str | None = None) -> HubModel | None:
    """The repo and revision of a hub uri (`revision`: the spec's `model.revision`), None otherwise."""
    parsed = StorageUri.of(uri)
    if parsed.scheme is not Scheme.HUB:
        return None
    return HubModel(parsed.repo, parsed.revision or revision or None)


def claim_model(uri: str) -> ClaimModel | None:
    """The claim and the folder inside it of a `pvc://` uri, None otherwise."""
    parsed = StorageUri.of(uri)
    if parsed.scheme is not Scheme.CLAIM:
        return None
    return ClaimModel(parsed.claim, parsed.path.strip("/"))
