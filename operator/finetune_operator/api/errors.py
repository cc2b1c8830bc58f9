"""Turn validation failures into one line per problem, naming the field.

Users see these lines from `ftjob validate`, in a `Failed/InvalidSpec` condition and in
Events, so they must read like the apiserver's own messages:
`spec.method.lora.r: must be >= 1 (got 0)`. Never a traceback.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from .rules import RULE_MARK
from .spec import PATTERN_HINTS

_UNION_TAGS = {"int", "str", "float", "bool", "none", "list", "dict", "is-instance", "literal", "lax-or-strict"}


def _is_union_tag(part: object) -> bool:
    if not isinstance(part, str):
        return False
    return part in _UNION_TAGS or "[" in part or part.startswith(("function-", "literal"))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += ("." if out else "") + part
    return out


def _allowed_fields(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str] | None:
    """Field names accepted at the parent of `loc`, walking the model by alias."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int) or _is_union_tag(part):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        match = [f for n, f in model.model_fields.items() if (f.alias or n) == part]
        if not match:
            return None
        model = _model_in(match[0].annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(f.alias or n for n, f in model.model_fields.items())
    return None


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    metadata_origin = getattr(annotation, "__origin__", None)
    if metadata_origin is not None and isinstance(metadata_origin, type) and issubclass(metadata_origin, BaseModel):
        return metadata_origin
    return None


def _message(error: Any, root: type[BaseModel]) -> tuple[str, str]:
    loc: tuple[int | str, ...] = tuple(error["loc"])
    kind: str = error["type"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    got = error.get("input")
    path = _path(loc)
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return path, f"must be an integer (got {got!r})"
    if kind == "missing":
        return path, "required"
    if kind == "extra_forbidden":
        allowed = _allowed_fields(root, loc)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return path, f"unknown field{hint}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "?")
        return path, f"must be {op} {bound} (got {got!r})"
    if kind in ("literal_error", "enum"):
        expected = str(ctx.get("expected", "")).replace("'auto'", "auto")
        return path, f"must be one of {expected} (got {got!r})"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        return path, f"invalid value {got!r}: {PATTERN_HINTS.get(pattern, 'must match ' + pattern)}"
    if kind in ("string_too_long", "too_long"):
        return path, f"too long: at most {ctx.get('max_length')} (got {got!r:.60})"
    if kind in ("string_too_short", "too_short"):
        return path, f"too short: at least {ctx.get('min_length')}"
    if kind == "value_error":
        text = str(ctx.get("error", error["msg"]))
        if text.startswith(RULE_MARK):
            _, field_path, rule_message = text.split(RULE_MARK, 2)
            return path + field_path, rule_message
        return path, text
    msg = str(error["msg"])
    return path, f"{msg[0].lower()}{msg[1:]} (got {got!r:.60})" if got is not None else msg


def describe(exc: ValidationError, root: type[BaseModel], prefix: str = "") -> list[str]:
    """One `field.path: message` line per problem, union alternatives merged."""
    merged: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        path, message = _message(error, root)
        full = f"{prefix}{path}" if path else prefix.rstrip(".") or "(document)"
        bucket = merged.setdefault(full, [])
        if message not in bucket:
            bucket.append(message)
    return [f"{path}: {' or '.join(messages)}" for path, messages in merged.items()]
