"""Why planning can fail, as exception types the operator maps onto conditions.

The operator turns `InvalidModelError` subclasses into `Failed/InvalidSpec` and
`DoesNotFitError` into `Failed/DoesNotFit`; `condition_reason` carries that mapping so
callers never have to pattern-match on messages.
"""

from __future__ import annotations

from finetune_operator.api import reasons


class PlanningError(ValueError):
    """Base of every planner failure; the message is meant for the user, as is."""

    condition_reason = reasons.INVALID_SPEC


class InvalidModelError(PlanningError):
    """The model's architecture cannot be determined or is not supported."""


class UnknownArchitectureError(InvalidModelError):
    """The model is neither in the catalogue nor a family the planner can count."""


class ModelConfigNotFoundError(InvalidModelError):
    """A local model directory (or file) without a readable config.json."""


class UnsupportedSettingError(PlanningError):
    """A setting the job's model cannot take; the message names the field and what is allowed."""


class DoesNotFitError(PlanningError):
    """No candidate strategy fits in GPU (and host) memory; says what would."""

    condition_reason = reasons.DOES_NOT_FIT

    def __init__(self, message: str, suggestions: list[str]) -> None:
        lines = [message] + [f"  - {s}" for s in suggestions]
        super().__init__("\n".join(lines))
        self.headline = message
        self.suggestions = suggestions
