"""Condition bookkeeping by the Kubernetes API conventions.

`lastTransitionTime` moves only when a condition's status flips; reason and message
may change without it. The headline `state` is derived from the conditions, never
stored on its own.
"""

from __future__ import annotations

from ..api.reasons import ConditionType, State
from ..api.status import Condition

ORDER = [t.value for t in ConditionType]


def get(conditions: list[Condition], kind: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def is_true(conditions: list[Condition], kind: ConditionType) -> bool:
    cond = get(conditions, kind)
    return cond is not None and cond.status == "True"


def set_condition(
    conditions: list[Condition],
    kind: ConditionType,
    status: bool,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> list[Condition]:
    """A new list with `kind` set; the list stays in lifecycle order."""
    text = "True" if status else "False"
    old = get(conditions, kind)
    changed = old is None or old.status != text
    new = Condition(
        type=kind.value,
        status=text,
        reason=reason,
        message=message[:32768],
        observed_generation=generation,
        last_transition_time=now if changed or old is None else old.last_transition_time,
    )
    others = [c for c in conditions if c.type != kind]
    return sorted([*others, new], key=lambda c: ORDER.index(c.type) if c.type in ORDER else len(ORDER))


def headline(conditions: list[Condition]) -> State:
    for kind, state in (
        (ConditionType.FAILED, State.FAILED),
        (ConditionType.SUCCEEDED, State.SUCCEEDED),
        (ConditionType.SUSPENDED, State.SUSPENDED),
        (ConditionType.QUEUED, State.QUEUED),
        (ConditionType.RESTARTING, State.RESTARTING),
        (ConditionType.RUNNING, State.RUNNING),
        (ConditionType.PLANNED, State.PLANNED),
    ):
        if is_true(conditions, kind):
            return state
    return State.PENDING
