"""What a lifecycle pass decides, for the reconciler to carry out: the contract between them.

`lifecycle.decide` returns a `Decision`: the complete new status, the events of the
transitions it made, and the `Effects` on the cluster (replicas and plan to render, pods or
the job to delete, the job's Kueue Workload). The reconciler writes and applies it; a
`Planner` and a `Replanner` are the planner as `decide` calls it (a `Planner` raises `PlanFailed`
or, while the model is being read, `PlanPending`). The reconciler keeps a
decision with the job body it was made on (`StatusChange`, `Decided`). Counters live in the status
and a failure's fingerprint counts it once, so an operator restart neither loses nor repeats one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..api.job import FineTuneJob
from ..api.spec import FineTuneJobSpec
from ..api.status import FineTuneJobStatus, PlanStatus

Planner = Callable[[FineTuneJobSpec], PlanStatus]
Replanner = Callable[[FineTuneJobSpec, PlanStatus], PlanStatus | None]


class PlanFailed(Exception):
    """Raised by a Planner adapter: `reason` is InvalidSpec or DoesNotFit, or why the model could
    not be read (ModelNotFound, ModelGated, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PlanPending(Exception):
    """Raised by a Planner adapter while the model's config.json is being read (an inspector pod
    runs, the hub did not answer): the job waits `Planned=False/<reason>` and is passed again
    after `retry_after` seconds."""

    def __init__(self, reason: str, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Effects:
    """What a pass does to the cluster, beside writing the status."""

    replicas: int
    plan: PlanStatus | None
    """The strategy to render the workers with (None: nothing is rendered)."""
    placement: dict[str, str] = field(default_factory=dict)
    """nodeLabels of the ResourceFlavors Kueue admitted the job on, for the pods' nodeSelector."""
    delete_pods: bool = False
    """Delete every pod of the gang: a gang restart, or pods left over from a gang that failed."""
    delete_job: bool = False
    requeue_after: float | None = None
    workload: dict[str, Any] | None = None
    """A Kueue Workload to create (the job is queued and has none yet)."""
    release_workload: bool = False
    """The evicted gang has stopped: give the Workload's quota reservation back to Kueue."""
    delete_workload: bool = False
    """Delete the job's Workload, its gang being stopped: its size or requests changed (a new one is
    made), or the job is suspended (its quota goes back; resuming queues it again)."""
    serve: tuple[dict[str, Any], ...] = ()
    """The serving objects to apply (`spec.serving`, after success): not owned by the job."""


@dataclass(frozen=True, kw_only=True)
class Decision(Effects):
    """Everything the operator should do for a job now: the status, its events and the effects."""

    status: FineTuneJobStatus
    events: tuple[Event, ...] = ()
    finish_workload: str | None = None
    """The job ended (Succeeded|Failed): mark its Workload Finished."""

    @classmethod
    def of(
        cls, effects: Effects, status: FineTuneJobStatus, events: tuple[Event, ...], finish_workload: str | None = None
    ) -> Decision:
        """The decision that writes `status`, emits `events` and has `effects`."""
        carried = {f.name: getattr(effects, f.name) for f in fields(Effects)}
        return cls(**carried, status=status, events=events, finish_workload=finish_workload)


def serialised(decision: Decision) -> dict[str, Any]:
    """The decided status as the apiserver stores it: what a pass compares and writes."""
    return decision.status.to_wire()


@dataclass(frozen=True)
class StatusChange:
    """A decided status and the job body it was decided on (whose resourceVersion guards the write)."""

    body: Mapping[str, Any]
    decision: Decision
    wire: dict[str, Any]
    """`serialised(decision)`, computed once per decision."""

    @property
    def stored(self) -> Any:
        return self.body.get("status") or {}

    @property
    def changed(self) -> bool:
        return bool(self.stored != self.wire)


@dataclass(frozen=True)
class Decided(StatusChange):
    """A decision on a valid job, with what the reconciler needs to act on it."""

    job: FineTuneJob
    read_status: FineTuneJobStatus | None
    """The status as read (a hand-edited one salvaged field by field)."""
    needs_apply: bool
    """The workers do not match the decision (none yet, another replica count, another config)."""

    def amended(self, decision: Decision) -> Decided:
        """The same pass with `decision` in place of its own (a child could not be written)."""
        return replace(self, decision=decision, wire=serialised(decision))
