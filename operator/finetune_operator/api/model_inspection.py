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

from . import reasons as R
from .base import ApiModel

FAILURE_REASONS = (R.MODEL_NOT_FOUND, R.MODEL_GATED, R.MODEL_ACCESS_DENIED, R.HUB_UNREACHABLE, R.NOT_CAUSAL_LM,
                   R.UNKNOWN_MODEL_TYPE, R.INSPECTION_FAILED)  # fmt: skip
"""Why a model could not be read (each named in `api/reasons.py`): the job's condition reason."""
RETRIED = (R.HUB_UNREACHABLE,)
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
        too_large = f"{self.origin}: config.json is too large to hand back ({len(wire)} bytes)"
        failure = ModelInspection.failed(self.origin, R.INSPECTION_FAILED, too_large)
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
