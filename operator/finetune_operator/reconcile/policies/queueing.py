"""Kueue admission: a queued job's gang starts only when its Workload is admitted, and an
eviction (preemption) scales it to 0 without counting a failure.

The operator is the Workload's job controller (Kueue's protocol for custom jobs): it creates
the Workload, waits for `Admitted`, turns the admitted ResourceFlavors' nodeLabels into the
pods' nodeSelector, and on `Evicted` stops the gang and then gives the quota back (clears
`status.admission`, `QuotaReserved` false), which Kueue waits for before it requeues the
Workload. When the job finishes, the Workload is marked `Finished` so its quota is released.
The cluster writes themselves are the reconciler's; this module only decides them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...api import reasons as R
from ...api.reasons import ConditionType, State
from ...api.status import PlanStatus, Workers
from ...render.workload import SPEC_HASH_ANNOTATION, workload
from ..conditions import is_true
from ..decision import Effects
from ..observed import KueueCondition, WorkloadView
from .phases import Admission, Inputs
from .status_builder import StatusBuilder

WAITING = "waiting for Kueue to admit the whole gang"


def admit(inputs: Inputs, b: StatusBuilder, plan: PlanStatus) -> Admission | Effects:
    """The job allowed to run (not queued, or admitted), or the effects of waiting in its queue."""
    queue = inputs.queue
    if queue is None:
        return Admission(plan, placement={})
    wl = inputs.observed.workload
    desired = workload(inputs.job, plan, queue)
    if wl is not None and wl.spec_hash != desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]:
        _stopped(inputs, b)
        message = "the job's size or requests changed: its Workload is replaced and admitted again"
        b.cond(ConditionType.QUEUED, True, R.WORKLOAD_CHANGED, message)
        return replace(inputs.stop(plan), delete_workload=not inputs.observed.live_pods)
    if wl is not None and wl.admitted:
        flavors = ", ".join(wl.flavors) or "the default flavor"
        message = f"admitted by Kueue from queue {queue} on {flavors}"
        b.cond(ConditionType.QUEUED, False, R.ADMITTED, message, announce=True)
        return Admission(plan, placement=dict(wl.node_labels))
    _stopped(inputs, b)
    if wl is None:
        b.cond(ConditionType.QUEUED, True, R.QUEUED, f"{WAITING} in queue {queue} (its Workload is {inputs.job.name})")
        return replace(inputs.stop(plan), workload=desired)
    evicted = wl.condition("Evicted")
    if evicted is not None and evicted.status == "True":
        if not is_true(b.status.conditions, ConditionType.QUEUED):
            made_room = int(evicted.reason == R.PREEMPTED)  # not e.g. a PodsReady timeout
            b.update(evictions=b.status.evictions + 1, preemptions=b.status.preemptions + made_room)
        message = (
            f"evicted by Kueue ({evicted.reason}): {evicted.message}; workers scaled to 0 (not a failure: "
            "restarts unchanged); the job resumes from its last checkpoint when admitted again"
        )
        b.cond(ConditionType.QUEUED, True, evicted.reason or R.EVICTED, message, warn=True)
        return replace(inputs.stop(plan), release_workload=wl.reserved and not inputs.observed.live_pods)
    reserved = wl.condition("QuotaReserved")
    reason = (reserved.reason if reserved else "") or R.QUEUED
    detail = reserved.message if reserved and reserved.message else "no decision yet"
    b.cond(ConditionType.QUEUED, True, reason, f"{WAITING} in queue {queue}: {detail}")
    return inputs.stop(plan)


def _stopped(inputs: Inputs, b: StatusBuilder) -> None:
    """The status of a queued job whose gang does not run."""
    b.cond(ConditionType.RUNNING, False, R.QUEUED, "")
    if is_true(b.status.conditions, ConditionType.RESTARTING):
        b.cond(ConditionType.RESTARTING, False, R.QUEUED, "")
    b.update(start_time=None, workers=Workers(ready=0, total=inputs.nodes, summary=f"0/{inputs.nodes}"))


def wrap_up(inputs: Inputs, state: State | None, effects: Effects) -> tuple[Effects, str | None]:
    """Kueue's part of the finish: a suspended job's Workload is deleted once its gang has stopped
    (resuming queues the job again); a finished job's is marked Finished (its quota goes back to
    the queue), with the reason returned."""
    wl = inputs.observed.workload
    if wl is not None and inputs.job.spec.suspend and state == State.SUSPENDED:
        return replace(effects, delete_workload=not inputs.observed.live_pods), None
    if wl is None or wl.is_true("Finished") or state not in (State.SUCCEEDED, State.FAILED):
        return effects, None
    return effects, "Succeeded" if state == State.SUCCEEDED else "Failed"


def _wire(condition: KueueCondition) -> dict[str, Any]:
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason or condition.type,
        "message": condition.message,
        "lastTransitionTime": condition.time,
    }


def _with(conditions: list[dict[str, Any]], kind: str, status: str, *, reason: str, message: str, now: str) -> None:
    old = next((c for c in conditions if c["type"] == kind), None)
    moved = old is None or old["status"] != status
    new = {"type": kind, "status": status, "reason": reason, "message": message[:32768]}
    new["lastTransitionTime"] = now if moved or old is None else old["lastTransitionTime"]
    conditions[:] = [c for c in conditions if c["type"] != kind] + [new]


def released_status(wl: WorkloadView, now: str) -> dict[str, Any]:
    """The Workload status after its evicted job stopped: no admission, no quota reservation
    (`Requeued` true after a preemption), as a Kueue job controller writes it."""
    evicted = wl.condition("Evicted")
    reason = evicted.reason if evicted else R.EVICTED
    message = evicted.message if evicted else "the job stopped"
    conditions = [_wire(c) for c in wl.conditions]
    requeued = "True" if reason == "Preempted" else "False"
    _with(conditions, "Requeued", requeued, reason=reason or R.EVICTED, message=message, now=now)
    _with(conditions, "QuotaReserved", "False", reason="Pending", message=message, now=now)
    _with(conditions, "Admitted", "False", reason="NoReservation", message="The workload has no reservation", now=now)
    return {"conditions": conditions, "admission": None}


def finished_status(wl: WorkloadView, reason: str, now: str) -> dict[str, Any]:
    """The Workload status of a job that ended: `Finished` true, which releases its quota."""
    conditions = [_wire(c) for c in wl.conditions]
    _with(conditions, "Finished", "True", reason=reason, message=f"the FineTuneJob {reason.lower()}", now=now)
    return {"conditions": conditions}
