"""The status one pass builds: every phase adds conditions, fields and events to it, and the
pass writes it once, at the end, only if it changed.

Conditions keep their `lastTransitionTime` unless their status flips (`conditions.set_condition`);
an Event marks each transition a user should hear about.
"""

from __future__ import annotations

from datetime import datetime

from ...api.job import FineTuneJob
from ...api.reasons import ConditionType
from ...api.status import FineTuneJobStatus
from ...api.timestamps import timestamp
from ..conditions import headline, is_true, set_condition
from ..decision import Event


class StatusBuilder:
    """Accumulates the new status and the events of each transition."""

    def __init__(self, job: FineTuneJob, now: datetime) -> None:
        self.job = job
        self.now = timestamp(now)
        self.old = job.status or FineTuneJobStatus()
        self.status = self.old.model_copy()
        self.events: list[Event] = []

    def cond(
        self,
        kind: ConditionType,
        on: bool,
        reason: str,
        message: str = "",
        *,
        warn: bool = False,
        announce: bool = False,
    ) -> None:
        """Set a condition; an event marks it turning true (or false, when `announce`)."""
        before = is_true(self.status.conditions, kind)
        conditions = set_condition(
            list(self.status.conditions),
            kind,
            on,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.job.metadata.generation,
        )
        self.status = self.status.model_copy(update={"conditions": conditions})
        if (on and not before) or (announce and before and not on):
            self.events.append(Event("Warning" if warn else "Normal", reason, message or kind.value))

    def event(self, reason: str, message: str, *, warn: bool = False) -> None:
        """An event that is no condition's transition."""
        self.events.append(Event("Warning" if warn else "Normal", reason, message))

    def update(self, **fields: object) -> None:
        self.status = self.status.model_copy(update=fields)

    def fail(self, reason: str, message: str) -> None:
        self.cond(ConditionType.FAILED, True, reason, message, warn=True)
        self.cond(ConditionType.RUNNING, False, reason, message)
        self.cond(ConditionType.RESTARTING, False, reason, "")
        self.update(completion_time=self.now)

    def finish(self) -> FineTuneJobStatus:
        """The status to write: the built one, with its generation, headline state and topology."""
        spec = self.job.spec.resources
        gpus = str(spec.gpus_per_node) if spec.gpus_per_node else "cpu"
        return self.status.model_copy(
            update={
                "observed_generation": self.job.metadata.generation,
                "state": headline(self.status.conditions),
                "topology": f"{spec.num_nodes}×{gpus}",
            }
        )
