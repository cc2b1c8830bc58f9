"""An offline stand-in for the apiserver's validation of a FineTuneJob, for tests.

It applies the generated CRD the way kube-apiserver does: nulls of non-nullable
fields are pruned, the structural OpenAPI schema is checked (translated to JSON Schema
for `jsonschema`, with `pattern` read by RE2 as Go's apiserver reads it, not by Python's `re`),
and every non-transition CEL rule is evaluated with cel-python (whose `matches()` is RE2 too).
The cluster tier checks the same documents against the real apiserver; this one lets
hypothesis compare pydantic and the schema on thousands of documents in seconds.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema  # type: ignore[import-untyped]
import re2  # type: ignore[import-untyped]  # google-re2: no stubs
from celpy.adapter import json_to_cel

from finetune_operator.api.crdgen import build_crd


def openapi_schema() -> dict[str, Any]:
    crd = build_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI v3 (Kubernetes dialect) → JSON Schema draft 2020-12."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes") or key in ("nullable", "description"):
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key == "anyOf":
            out[key] = [to_json_schema(v) for v in value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if value:
                bound = "minimum" if key == "exclusiveMinimum" else "maximum"
                out[key] = node[bound]
        elif key in ("minimum", "maximum") and node.get("exclusive" + key.capitalize()):
            continue
        else:
            out[key] = value
    if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def prune_nulls(doc: Any, schema: dict[str, Any]) -> Any:
    """Drop nulls the apiserver would prune (fields not marked nullable)."""
    if isinstance(doc, dict) and "properties" in schema:
        out = {}
        for key, value in doc.items():
            sub = schema["properties"].get(key)
            if value is None and sub is not None and not sub.get("nullable"):
                continue
            out[key] = prune_nulls(value, sub) if sub else value
        return out
    if isinstance(doc, list) and isinstance(schema.get("items"), dict):
        return [prune_nulls(v, schema["items"]) for v in doc]
    return doc


_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    return _PROGRAMS[rule]


def cel_failures(doc: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Messages of the CEL rules `doc` breaks (transition rules are skipped)."""
    failures: list[str] = []
    if doc is None:
        return failures
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        result = _program(rule["rule"]).evaluate({"self": json_to_cel(doc)})
        if isinstance(result, Exception) or not bool(result):
            failures.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(doc, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in doc:
                failures += cel_failures(doc[key], sub, f"{path}.{key}")
    if isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(doc):
            failures += cel_failures(item, schema["items"], f"{path}[{i}]")
    return failures


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    """JSON Schema's `pattern` as the apiserver applies it: RE2, searched (Go's regexp.MatchString)."""
    if validator.is_type(instance, "string") and re2.search(pattern, instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_VALIDATOR = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _re2_pattern})


class ApiserverEmulation:
    """Validates a manifest as the apiserver would on create."""

    def __init__(self) -> None:
        self.openapi = openapi_schema()
        schema = to_json_schema(self.openapi)
        schema["properties"]["metadata"].pop("additionalProperties")  # ObjectMeta is the apiserver's own
        self.validator = _VALIDATOR(schema)

    def problems(self, document: dict[str, Any]) -> list[str]:
        doc = prune_nulls(copy.deepcopy(document), self.openapi)
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in self.validator.iter_errors(doc)]
        if errors:
            return errors
        return cel_failures(doc, self.openapi)
