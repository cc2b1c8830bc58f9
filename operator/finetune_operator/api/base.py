"""Shared building blocks of the FineTuneJob API models.

Every model is frozen, rejects unknown fields and speaks camelCase on the wire, so
the object a handler receives can be passed around without defensive copies and
round-trips exactly through the apiserver. Kubernetes quantities ("80Gi", 8, "500m")
are kept as the user wrote them and parsed on demand.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

QUANTITY_PATTERN = r"^(\+)?([0-9]{1,18}(\.[0-9]{0,18})?|\.[0-9]{1,18})(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
"""At most 18 digits either side of the point: a 400-digit `gpuMemory` once overflowed the planner."""
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}

MAX_NESTING = 64
"""Lists and objects in a document, one inside the other. The deepest field of a FineTuneJob
is about 12 levels down; the apiserver admits 10,000 where a schema keeps unknown fields, and
the JSON parser pydantic validates with stops at a few hundred without saying where."""


def first_too_deep(data: Any, limit: int = MAX_NESTING) -> tuple[str | int, ...] | None:
    """Where `data` first nests deeper than `limit`: the path to the last object key above
    that point (list indices below it are left out), or None. Iterative, so any depth is fine."""
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(data, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict | list) and depth >= limit:
            while path and isinstance(path[-1], int):
                path = path[:-1]
            return path
        if isinstance(node, dict):
            stack.extend((v, (*path, str(k)), depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*path, i), depth + 1) for i, v in enumerate(node))
    return None


QUALIFIED_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
"""A label, taint or resource key: an optional DNS prefix and '/', then a name."""
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A label (or taint) value: empty, or letters and digits with -_. inside."""
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def check_node_selector(value: dict[str, str] | None) -> dict[str, str] | None:
    """Node-selector keys must be qualified names (a pattern on map keys is not a structural
    CRD schema, so this runs in pydantic: the operator answers Failed/InvalidSpec)."""
    for key in value or {}:
        if len(key) > 317 or not re.fullmatch(QUALIFIED_NAME_PATTERN, key):
            raise ValueError(f"key {key!r} is not a valid label key (an optional DNS prefix and '/', then a name)")
    return value


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Patterns are read by three engines: Go's RE2 (the CRD's `pattern` and CEL's `matches()` in the
# apiserver), Rust's regex (pydantic) and Python's `re`. Their `\s`, `\S`, `\d` and `\w` differ
# beyond ASCII (RE2's `\s` is [\t\n\f\r ] only; Rust's and Python's are Unicode), so the
# patterns here spell their classes out, with `\xHH` escapes, which all three read alike.
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
"""C0 and C1 control characters (a class body)."""
SPACE_CHARS = r"\t\n\x0b\x0c\r \x85\xa0"
"""Spaces below U+0100 (a class body), written as escapes all three engines read alike. Wider Unicode
spaces are ordinary characters here: they would need a long escape, which Python's `re` does not know."""
VISIBLE = f"[^{CONTROL_CHARS}{SPACE_CHARS}]"
"""One character that is neither a control character nor a space."""
ABSOLUTE_PATH_PATTERN = f"^/{VISIBLE}*$"
"""An absolute path in a container, without spaces or control characters."""

SECRET_KEY_PATTERN = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
"""A Secret or ConfigMap key as Kubernetes takes it (IsConfigMapKey): letters, digits, '-', '_'
and '.', but not '.' or '..' and not starting with '..'."""
SECRET_KEY_HINT = (
    "must be a Secret key: letters, digits, '-', '_' and '.' (at most 253), not '.' or '..' and not starting with '..'"
)

PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
"""A TCP port, 1 to 65535, without leading zeros."""
HOST = r"([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
"""A host name, an IPv4 address or a bracketed IPv6 address."""
HTTP_URL_PATTERN = rf"^https?://{HOST}(:{PORT})?(/[^{CONTROL_CHARS}{SPACE_CHARS}?#@]*)?$"
"""An http(s) URL: scheme, host, optional port and path; no credentials, query or fragment."""
HTTP_URL_HINT = (
    "must be an http:// or https:// URL: scheme, host, optional port (1-65535) and path; no credentials, "
    "query, fragment or spaces"
)


class ApiModel(BaseModel):
    """Base of every API model: frozen, strict about unknown fields, camelCase aliases."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=False,
        use_enum_values=True,
        strict=True,
    )

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        """Validate a wire object (parsed JSON/YAML) strictly, as the apiserver would.

        Strict JSON-mode validation: no "yes" for a boolean, no "8" for an integer, but
        enum members may be given as their strings.
        """
        too_deep = first_too_deep(data)
        if too_deep is not None:
            error = ValueError(f"nested deeper than {MAX_NESTING} levels of lists and objects")
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": "value_error", "loc": too_deep, "input": "...", "ctx": {"error": error}}]
            )
        return cls.model_validate_json(json.dumps(data, default=str))

    def to_wire(self) -> dict[str, Any]:
        """The object as the apiserver stores it: camelCase keys, no unset optionals."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("80Gi", "1.5G", 8, "500m") into a Decimal."""
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY_RE.match(value.strip())
    if not match:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ValueError(
            f"not a Kubernetes quantity: {shown!r} (examples: 80Gi, 24Gi, 512Mi, 8, 500m; at most 18 digits)"
        )
    number, suffix = match.group(2), match.group(4) or ""
    return Decimal(number) * _SUFFIX[suffix]


def quantity_bytes(value: str | int | float) -> int:
    """A memory quantity in whole bytes."""
    return int(parse_quantity(value))


def _check_quantity(value: str | int) -> str | int:
    if isinstance(value, bool):
        raise ValueError("must be a Kubernetes quantity such as 80Gi or 8, not a boolean")
    if isinstance(value, int) and not 0 <= value < 2**63:
        raise ValueError("must be a Kubernetes quantity such as 80Gi or 8, at most 18 digits")
    if isinstance(value, str) and value != value.strip():
        # the apiserver's pattern admits no space (nor a trailing newline) around the number
        raise ValueError("must be a Kubernetes quantity such as 80Gi or 8, without spaces around it")
    parse_quantity(value)
    return value


Quantity = Annotated[
    str | int,
    AfterValidator(_check_quantity),
    Field(json_schema_extra={"x-ftjob-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
"""A Kubernetes quantity; rendered in the CRD as int-or-string with the quantity pattern."""
