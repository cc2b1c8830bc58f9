"""A manifest as the apiserver stores it, so `ftjob validate` judges the object the operator sees.

Before it validates a custom resource, the apiserver
- drops an explicit `null` wherever the schema does not mark the field `nullable` (the field
  then takes its default);
- stores a JSON number such as `42.0` in an `integer` field as the integer it equals;
and it refuses metadata labels and annotations that are not label keys and values.
Without this, `ftjob validate` refused manifests `kubectl apply` takes, and passed labels it
refuses.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from ..api.base import LABEL_VALUE_PATTERN, QUALIFIED_NAME_PATTERN
from ..api.crdgen import build_crd

MAX_ANNOTATIONS_BYTES = 256 * 1024
"""The apiserver's limit on all annotations of an object together (keys and values)."""


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _as_stored(value: Any, schema: dict[str, Any]) -> Any:
    if schema.get("type") == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if sub is None:  # unknown or preserved as is: the apiserver leaves it alone (or prunes it)
                out[key] = item
            elif item is None and not sub.get("nullable", False):
                continue
            else:
                out[key] = _as_stored(item, sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_as_stored(item, schema["items"]) for item in value]
    return value


def as_stored(doc: dict[str, Any]) -> dict[str, Any]:
    """The document after the apiserver's null pruning and integer normalisation."""
    stored: dict[str, Any] = _as_stored(doc, _schema())
    return stored


def metadata_problems(doc: dict[str, Any]) -> list[str]:
    """What the apiserver says about metadata.labels and metadata.annotations, one line each."""
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        return []
    problems: list[str] = []
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        return ["metadata.labels: must be a map of strings"]
    for key, value in labels.items():
        problems.extend(_key_problems(f"metadata.labels[{key!r}]", key))
        if not isinstance(value, str):
            problems.append(f"metadata.labels[{key!r}]: the value must be a string (quote it)")
        elif len(value) > 63 or not re.match(LABEL_VALUE_PATTERN, value):
            problems.append(
                f"metadata.labels[{key!r}]: invalid value {value!r}: at most 63 characters, empty or letters, "
                "digits and -_. starting and ending with a letter or digit"
            )
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, dict):
        return [*problems, "metadata.annotations: must be a map of strings"]
    size = 0
    for key, value in annotations.items():
        problems.extend(_key_problems(f"metadata.annotations[{key!r}]", key))
        if not isinstance(value, str):
            problems.append(f"metadata.annotations[{key!r}]: the value must be a string (quote it)")
        else:
            size += len(str(key).encode()) + len(value.encode())
    if size > MAX_ANNOTATIONS_BYTES:
        problems.append(f"metadata.annotations: {size:,} bytes in all; the apiserver allows {MAX_ANNOTATIONS_BYTES:,}")
    return problems


def _key_problems(where: str, key: Any) -> list[str]:
    text = str(key)
    prefix, _, name = text.rpartition("/")
    if not isinstance(key, str) or len(name) > 63 or len(prefix) > 253 or not re.match(QUALIFIED_NAME_PATTERN, text):
        return [
            f"{where}: invalid key: an optional DNS prefix (at most 253 characters) and '/', then a name of at "
            "most 63 letters, digits and -_. starting and ending with a letter or digit"
        ]
    return []
