"""What every lifecycle policy reads and writes: the job, the observed children, the clock,
the status being built, and the decision the pass will act on.

A policy never talks to the cluster. It reads `Context`, adds conditions and events through
`StatusBuilder`, and either returns the `Decision` that ends the pass or None to hand on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ...api.job import FineTuneJob
from ...api.reasons import ConditionType
from ...api.spec import FineTuneJobSpec
from ...api.status import FineTuneJobStatus, PlanStatus, Progress
from ...api.timestamps import timestamp
from ..conditions import headline, is_true, set_condition
from ..observed import Observed, PodView
from ..tracking import TrackingReport

Planner = Callable[[FineTuneJobSpec], PlanStatus]
Replanner = Callable[[FineTuneJobSpec, PlanStatus], PlanStatus | None]


class PlanFailed(Exception):
    """Raised by a Planner adapter: `reason` is InvalidSpec or DoesNotFit."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    status: FineTuneJobStatus
    replicas: int
    plan: PlanStatus | None
    delete_pods: bool = False
    delete_job: bool = False
    requeue_after: float | None = None
    events: list[Event] = field(default_factory=list)
    workload: dict[str, Any] | None = None
    """A Kueue Workload to create (the job is queued and has none yet)."""
    release_workload: bool = False
    """The evicted gang has stopped: give the Workload's quota reservation back to Kueue."""
    delete_workload: bool = False
    """Delete the job's Workload, its gang being stopped: its size or requests changed (a new one is
    made), or the job is suspended (its quota goes back; resuming queues it again)."""
    finish_workload: str | None = None
    """The job ended (Succeeded|Failed): mark its Workload Finished."""
    placement: dict[str, str] = field(default_factory=dict)
    """nodeLabels of the ResourceFlavors Kueue admitted the job on, for the pods' nodeSelector."""


def describe_plan(plan: PlanStatus) -> str:
    offload = []
    if plan.offload_optimizer != "none":
        offload.append(f"optimizer→{plan.offload_optimizer}")
    if plan.offload_params != "none":
        offload.append(f"params→{plan.offload_params}")
    checkpointing = "on" if plan.gradient_checkpointing else "off"
    return (
        f"ZeRO-{plan.zero_stage}, offload {', '.join(offload) or 'none'}, micro-batch {plan.micro_batch_size} × "
        f"accumulation {plan.gradient_accumulation_steps}, checkpointing {checkpointing}"
    )


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
        spec = self.job.spec.resources
        gpus = str(spec.gpus_per_node) if spec.gpus_per_node else "cpu"
        return self.status.model_copy(
            update={
                "observed_generation": self.job.metadata.generation,
                "state": headline(self.status.conditions),
                "topology": f"{spec.num_nodes}×{gpus}",
            }
        )


@dataclass
class Context:
    """One pass's inputs and the state the policies build up, in the order they run."""

    job: FineTuneJob
    observed: Observed
    now: datetime
    planner: Planner
    replanner: Replanner
    desired_config_hash: Callable[[PlanStatus], str]
    progress: Progress | None
    status: StatusBuilder
    queue: str | None = None
    """The Kueue LocalQueue the job waits in (None: the job is not queued)."""
    plan: PlanStatus | None = None
    """Set by the planning policy: the strategy in force."""
    started: datetime | None = None
    """Set by the deadline policy: when the job (last) started running."""
    requeue_after: float | None = None
    """Set by the deadline policy: seconds until the deadline passes."""
    pods: tuple[PodView, ...] = ()
    """Set by the gang policy: the live pods of the current gang."""
    ready: int = 0
    placement: dict[str, str] = field(default_factory=dict)
    """Set by the queueing policy: the admitted flavors' nodeLabels."""
    decision: Decision | None = None
    """Set by the gang policy: what the worker policies refine."""
    tracking: TrackingReport | None = None
    """Rank 0's report on the job's experiment tracking, from this pass's scrape (None: no news)."""

    @property
    def workers_decision(self) -> Decision:
        """The decision the gang policy made, for the worker policies that refine it."""
        if self.decision is None:
            raise RuntimeError("the gang policy must run before the worker policies")
        return self.decision

    @property
    def nodes(self) -> int:
        return self.job.spec.resources.num_nodes

    def stop(self, replicas: int = 0) -> Decision:
        """A decision that ends the pass before the workers were looked at."""
        return Decision(self.status.status, replicas=replicas, plan=self.plan)
