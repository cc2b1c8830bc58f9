"""The FineTuneJob resource as a whole, and its fixed external names.

`FineTuneJob.from_manifest` is the one door through which untrusted documents enter:
anything that passes it is safe to hand to the planner, the renderers or the trainer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import ApiModel
from .spec import FineTuneJobSpec
from .status import FineTuneJobStatus

GROUP = "finetune.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "FineTuneJob"
PLURAL = "finetunejobs"
SINGULAR = "finetunejob"
SHORT_NAMES = ("ftj",)
CRD_NAME = f"{PLURAL}.{GROUP}"
MAX_NAME_LENGTH = 52
"""StatefulSet pods get a `controller-revision-hash` label of name + 11 chars (<= 63)."""
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(BaseModel):
    """The parts of ObjectMeta the operator reads; everything else passes through."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class FineTuneJob(ApiModel):
    """A fine-tuning job: one document the user applies."""

    api_version: Literal["finetune.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["FineTuneJob"]
    metadata: ObjectMeta
    spec: FineTuneJobSpec
    status: FineTuneJobStatus | None = None

    @classmethod
    def from_manifest(cls, document: dict[str, Any]) -> FineTuneJob:
        """Validate a manifest; raises pydantic's ValidationError (see `errors.describe`)."""
        return cls.from_wire(document)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


def is_finetunejob(document: object) -> bool:
    """True when a parsed YAML document claims to be a FineTuneJob of any version."""
    return (
        isinstance(document, dict)
        and document.get("kind") == KIND
        and str(document.get("apiVersion", "")).startswith(GROUP + "/")
    )
