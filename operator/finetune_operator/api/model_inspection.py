"""What reading a model's files found: its config.json and weight bytes, or why it could not.

The operator reads a public hub model itself; a model on a claim, or a hub model that needs the
job's token, is read by a short-lived inspector pod (`ftjob inspect-model`), which hands the
result back as its termination message. Both produce a `ModelInspection`, so the operator turns
either into the same plan or the same condition. The wire form is gzip'd JSON in base64 behind a
marker line: a config.json of a few KB fits the kubelet's 4096-byte termination message.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Annotated, Any

from pydantic import Field, ValidationError

from .base import ApiModel

MODEL_NOT_FOUND = "ModelNotFound"
"""No such repo, revision, claim folder or config.json; or no safetensors weights."""
MODEL_GATED = "ModelGated"
"""A gated (or private) hub model and no token: the fix names spec.hfTokenSecretRef."""
MODEL_ACCESS_DENIED = "ModelAccessDenied"
"""The hub refused the job's token, or its account has no access to the gated model."""
HUB_UNREACHABLE = "HubUnreachable"
"""The endpoint did not answer (connection, timeout, 5xx): retried with backoff, the job waits."""
NOT_CAUSAL_LM = "NotCausalLM"
"""The config describes no causal language model (e.g. an encoder)."""
UNKNOWN_MODEL_TYPE = "UnknownModelType"
"""The model_type is unknown to the trainer image's transformers."""
INSPECTION_FAILED = "ModelInspectionFailed"
"""The inspector pod failed without a verdict (it crashed, or its answer could not be read)."""

FAILURE_REASONS = (MODEL_NOT_FOUND, MODEL_GATED, MODEL_ACCESS_DENIED, HUB_UNREACHABLE, NOT_CAUSAL_LM,
                   UNKNOWN_MODEL_TYPE, INSPECTION_FAILED)  # fmt: skip
RETRIED = (HUB_UNREACHABLE,)
"""Failures that are waited out; every other one fails the job."""

MARKER = "ftjob-model-inspection/v1"
MAX_MESSAGE_BYTES = 4096
"""The kubelet keeps at most this much of a container's termination message."""
BULKY_KEYS = ("id2label", "label2id", "task_specific_params", "auto_map", "quantization_config")
"""Keys the planner never reads, dropped (in this order) when a config would not fit the message."""


class ModelInspection(ApiModel):
    """A model's config.json and weight bytes, or a failure reason and message."""

    origin: Annotated[str, Field(max_length=1024)]
    """Where it was read: `hub:org/name@<commit>` or `pvc://claim/path`."""
    config: dict[str, Any] | None = None
    weight_bytes: Annotated[int, Field(ge=0)] | None = None
    """Bytes of the files a pod downloads (safetensors, configs, tokenizer): what the cache must hold."""
    commit: Annotated[str, Field(max_length=64)] | None = None
    failure: Annotated[str, Field(max_length=64)] | None = None
    """One of FAILURE_REASONS, or None when `config` is set."""
    message: Annotated[str, Field(max_length=2048)] | None = None

    @classmethod
    def failed(cls, origin: str, reason: str, message: str) -> ModelInspection:
        return cls(origin=origin, failure=reason, message=message[:2048])

    def to_message(self) -> str:
        """The termination message: the marker line and the compressed JSON, under MAX_MESSAGE_BYTES."""
        current = self
        for key in (None, *BULKY_KEYS):
            if key is not None and current.config is not None and key in current.config:
                current = current.model_copy(update={"config": {k: v for k, v in current.config.items() if k != key}})
            wire = current.model_dump_json(by_alias=True, exclude_none=True).encode()
            text = f"{MARKER}\n{base64.b64encode(gzip.compress(wire, mtime=0)).decode()}"
            if len(text) <= MAX_MESSAGE_BYTES:
                return text
        failure = ModelInspection.failed(
            self.origin, INSPECTION_FAILED, f"{self.origin}: config.json is too large to hand back ({len(wire)} bytes)"
        )
        return failure.to_message()

    @classmethod
    def from_message(cls, text: str) -> ModelInspection | None:
        """Parse a termination message; None when it is not an inspection (a crash, logs)."""
        head, _, body = text.strip().partition("\n")
        if head.strip() != MARKER:
            return None
        try:
            return cls.model_validate_json(gzip.decompress(base64.b64decode(body.strip(), validate=True)))
        except (ValueError, OSError, ValidationError, json.JSONDecodeError):
            return None
