"""The FineTuneJob page: every field of spec and status, from the pydantic API models.

It walks the models' own JSON schema (pydantic's, by alias: the camelCase names users write),
the same schema the CRD generator converts, and lists for each field its path, type, default,
allowed values (enums, bounds, lengths, short patterns) and description. A field added to a
model appears here on the next generation; `--check` in CI fails until the page is committed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import FineTuneJobStatus

from . import cell

LONG_PATTERN = 60  # longer patterns are long alternations of URI forms: the description says them in words
_UNSET = object()


@dataclass(frozen=True)
class Field:
    path: str
    type: str
    default: str
    allowed: str
    description: str


class _Walker:
    def __init__(self, model: type[BaseModel]) -> None:
        self.schema = model.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = self.schema.get("$defs", {})
        self.rows: list[Field] = []

    def resolve(self, node: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            merged = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return merged, name
        return node, None

    def branches(self, node: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        """The non-null alternatives of a node (one, unless it is int-or-string), and whether null is allowed."""
        if "anyOf" not in node:
            return [node], False
        alternatives = node["anyOf"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        kept = [{**b, **rest} for b in alternatives if b.get("type") != "null"]
        return kept, len(kept) < len(alternatives)

    def type_name(self, node: dict[str, Any]) -> str:
        node, ref = self.resolve(node)
        if node.get("x-ftjob-int-or-string"):
            return "integer or string"
        if node.get("x-ftjob-bool-or-auto"):
            return "boolean or `auto`"
        kind = node.get("type")
        if kind == "array":
            return f"list of {self.type_name(node.get('items', {}))}"
        if kind == "object":
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and "properties" not in node:
                return f"map of {self.type_name(extra)}"
            return ref or "object"
        if kind is None and "anyOf" in node:
            branches, _ = self.branches(node)
            return " or ".join(self.type_name(b) for b in branches)
        return str(kind or "any")

    def allowed(self, node: dict[str, Any]) -> str:
        node, _ = self.resolve(node)
        parts: list[str] = []
        if "enum" in node:
            parts.append(", ".join(f"`{json.dumps(v)}`" for v in node["enum"]))
        if "const" in node:
            parts.append(f"`{json.dumps(node['const'])}`")
        for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
            if key in node:
                parts.append(f"{sign} {node[key]}")
        for key, what in (("minLength", "length >="), ("maxLength", "length <="), ("minItems", "items >="),
                          ("maxItems", "items <="), ("maxProperties", "keys <=")):  # fmt: skip
            if key in node:
                parts.append(f"{what} {node[key]}")
        if "pattern" in node:
            pattern = node["pattern"]
            parts.append(f"pattern `{pattern}`" if len(pattern) <= LONG_PATTERN else "a pattern (see the description)")
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            inner = self.allowed(node["items"])
            if inner:
                parts.append(f"each: {inner}")
        return "; ".join(parts)

    def walk(self, node: dict[str, Any], path: str, seen: tuple[str, ...]) -> None:
        node, ref = self.resolve(node)
        if ref is not None and ref in seen:
            return
        seen = (*seen, ref) if ref else seen
        branches, _ = self.branches(node)
        if len(branches) == 1 and branches[0] is not node:
            self.walk(branches[0], path, seen)
            return
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            self.walk(node["items"], f"{path}[]", seen)
            return
        if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            self.walk(node["additionalProperties"], f"{path}.<key>", seen)
        for name, prop in node.get("properties", {}).items():
            self.field(prop, f"{path}.{name}" if path else name, name in node.get("required", ()))
            self.walk(prop, f"{path}.{name}" if path else name, seen)

    def field(self, prop: dict[str, Any], path: str, required: bool) -> None:
        branches, _ = self.branches(prop)
        default = prop.get("default", _UNSET)
        if required:
            shown = "required"
        elif default is _UNSET or default is None:
            shown = ""
        else:
            shown = f"`{json.dumps(default)}`"
        resolved, _ = self.resolve(prop)
        description = prop.get("description") or resolved.get("description", "")
        type_name = " or ".join(self.type_name(b) for b in branches)
        allowed = "; ".join(a for a in (self.allowed(b) for b in branches) if a)
        self.rows.append(Field(path, type_name, shown, allowed, description))


def fields(model: type[BaseModel]) -> list[Field]:
    """Every field of the model and of the models below it, depth first, as users write their paths."""
    walker = _Walker(model)
    walker.walk({k: v for k, v in walker.schema.items() if k != "$defs"}, "", ())
    return walker.rows


HEADER = ["| Field | Type | Default | Allowed | Description |", "|---|---|---|---|---|"]


def _row(f: Field, prefix: str) -> str:
    return f"| `{prefix}.{f.path}` | {cell(f.type)} | {cell(f.default)} | {cell(f.allowed)} | {cell(f.description)} |"


def table(model: type[BaseModel], prefix: str) -> list[str]:
    """Top-level fields without sub-fields in one table, then a section per field that has some."""
    rows = fields(model)
    top = [f.path for f in rows if "." not in f.path and "[" not in f.path]
    nested = {p for p in top if any(f.path.startswith((p + ".", p + "[")) for f in rows)}
    lines = ["", f"### Fields of `{prefix}` without sub-fields", "", *HEADER]
    lines += [_row(f, prefix) for f in rows if f.path in top and f.path not in nested]
    for f in rows:
        owner = f.path.split(".")[0].split("[")[0]
        if owner not in nested:
            continue
        if f.path == owner:
            lines += ["", f"### `{prefix}.{f.path}`", "", cell(f.description), "", *HEADER]
        lines.append(_row(f, prefix))
    return lines


def page() -> str:
    lines = [
        "# FineTuneJob fields",
        "",
        "`finetune.dev/v1alpha1`, kind `FineTuneJob` (short name `ftj`). Every field of `spec` and `status`, "
        "read off the frozen pydantic models in `operator/finetune_operator/api/`, from which the CRD in "
        "`crds/` is generated too. Rules that span fields (CEL on the apiserver, the same check in "
        "`ftjob validate`) are in the descriptions; `ftjob validate FILE` applies all of them offline.",
        "",
        "## spec",
    ]
    lines += table(FineTuneJobSpec, "spec")
    lines += ["", "## status", "", "Written by the operator through the status subresource; read-only for users."]
    lines += table(FineTuneJobStatus, "status")
    return "\n".join(lines) + "\n"
