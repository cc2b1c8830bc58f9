"""Rules that span several fields, written once and enforced twice.

Each rule carries a CEL expression (emitted into the CRD as `x-kubernetes-validations`,
so the apiserver rejects the object) and an equivalent Python predicate (run by the
pydantic model, so `ftjob validate` and the operator give the same verdict offline).
Keeping both in one record is what stops the two from drifting; a cluster-tier test
feeds every rule's counter-example to the real apiserver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import model_validator

from .base import ApiModel

RULE_MARK = "\x1frule:"
"""Starts a rule's ValueError text: `RULE_MARK<field path>RULE_MARK<message>` (api.errors reads it)."""


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule on one object of the API.

    `cel` sees the object as `self`; `check` gets the validated pydantic model and
    returns True when the object is acceptable. `field_path` is where the message
    points, relative to the object (e.g. ".offloadParams").
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""
    transition: bool = False

    def to_crd(self) -> dict[str, str]:
        rule: dict[str, str] = {"rule": self.cel, "message": self.message}
        if self.field_path:
            rule["fieldPath"] = self.field_path
        return rule


def rules_of(model: type[Any]) -> tuple[CrossFieldRule, ...]:
    """The rules declared on a model class through its `__rules__` attribute."""
    return tuple(getattr(model, "__rules__", ()))


class RuledModel(ApiModel):
    """A model whose `__rules__` are checked in Python as well as by the apiserver."""

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        for rule in rules_of(type(self)):
            if not rule.transition and not rule.check(self):
                raise ValueError(f"{RULE_MARK}{rule.field_path}{RULE_MARK}{rule.message}")
        return self
