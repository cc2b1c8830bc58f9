"""The job lifecycle as one pure decision: job + observed children + clock → what to do.

`decide` never talks to the cluster. It returns the complete new status (written once
by the caller, only if it changed), the replicas and plan to render, whether to
delete the whole gang of pods, whether the TTL has expired, and the events of the
transitions it made. Counters live in status, so an operator restart loses nothing,
and a failure is identified by a fingerprint so it is counted exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ..api.job import FineTuneJob
from ..api.spec import FineTuneJobSpec
from ..api.status import (
    ConditionType,
    FineTuneJobStatus,
    LastFailure,
    PlanStatus,
    Progress,
    Result,
    Workers,
)
from . import reasons as R
from .conditions import get, headline, is_true, set_condition
from .observed import Observed, PodView, Termination

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


def _ts(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_ts(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


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


class _Builder:
    """Accumulates the new status and the events of each transition."""

    def __init__(self, job: FineTuneJob, now: datetime) -> None:
        self.job = job
        self.now = _ts(now)
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

    def update(self, **fields: object) -> None:
        self.status = self.status.model_copy(update=fields)

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


def _fail(b: _Builder, reason: str, message: str) -> None:
    b.cond(ConditionType.FAILED, True, reason, message, warn=True)
    b.cond(ConditionType.RUNNING, False, reason, message)
    b.cond(ConditionType.RESTARTING, False, reason, "")
    b.update(completion_time=b.now)


def _first_failure(pods: tuple[PodView, ...]) -> tuple[PodView, Termination] | None:
    for pod in pods:
        term = pod.failure
        if term is not None:
            return pod, term
    return None


def _result(term: Termination) -> Result:
    summary = R.summary_of(term)

    def num(*keys: str) -> float | None:
        for key in keys:
            value = summary.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return None

    steps, tokens, skipped = num("steps", "globalStep"), num("tokens", "tokensTrained"), num("skippedRecords")
    adapter = summary.get("adapterUri") or summary.get("modelUri") or summary.get("adapter")
    merged = summary.get("merged") or summary.get("mergedModelUri")
    return Result(
        adapter_uri=str(adapter) if adapter else None,
        merged_model_uri=str(merged) if merged else None,
        final_loss=num("finalLoss", "final_loss", "loss"),
        eval_loss=num("evalLoss", "eval_loss"),
        eval_loss_before=num("evalLossBefore"),
        exact_match=num("exactMatch"),
        exact_match_before=num("exactMatchBefore"),
        skipped_records=int(skipped) if skipped is not None else None,
        steps=int(steps) if steps is not None else None,
        tokens=int(tokens) if tokens is not None else None,
        wall_seconds=num("wallSeconds", "wall_seconds"),
    )


def _final_progress(progress: Progress | None, result: Result, now: str) -> Progress:
    """Progress at the end, from the trainer's own summary (a short run may finish between scrapes)."""
    steps = result.steps if result.steps is not None else (progress.step if progress else 0)
    return Progress(
        step=steps,
        total_steps=steps,
        epoch=progress.epoch if progress else None,
        loss=round(result.final_loss, 4) if result.final_loss is not None else (progress.loss if progress else None),
        percent=100,
        eta_seconds=0,
        summary=f"{steps}/{steps} (100%)",
        skipped_records=result.skipped_records,
        last_update_time=now,
    )


def _resume_note(job: FineTuneJob) -> str:
    """What the new gang does with the checkpoint after a re-plan (the trainer logs the details)."""
    if str(job.spec.method.type) == "full":
        return "resuming from the last checkpoint only if its ZeRO stage and world size are unchanged"
    return "the new gang resumes from the last checkpoint, converted to the new strategy"


def _handle_failure(
    b: _Builder, job: FineTuneJob, pod: PodView, term: Termination, *, plan: PlanStatus, replanner: Replanner
) -> tuple[PlanStatus, bool]:
    """Count the failure once; returns the plan to run and whether to restart the gang."""
    fingerprint = pod.fingerprint(term)
    last = b.status.last_failure
    if last is not None and last.fingerprint == fingerprint:
        return plan, True  # already counted; the deletion may not have happened yet
    cause = R.root_cause(term, pod.name)
    oom = R.is_out_of_memory(term)
    b.update(
        last_failure=LastFailure(
            reason=R.OUT_OF_MEMORY if oom else R.RANK_FAILED,
            message=cause,
            rank=pod.ordinal,
            exit_code=term.exit_code,
            time=b.now,
            fingerprint=fingerprint,
        )
    )
    policy = job.spec.failure_policy
    permanent = R.not_retried(term)
    if permanent is not None:
        _fail(b, permanent, f"{cause}; not retried: a restart would fail the same way (fix it in a new job)")
        return plan, False
    if b.status.restarts >= policy.backoff_limit:
        _fail(b, R.BACKOFF_EXCEEDED, f"{b.status.restarts} restarts used of {policy.backoff_limit}; last: {cause}")
        return plan, False
    if oom and policy.on_out_of_memory == "Replan":
        frugal = replanner(job.spec, plan)
        if frugal is None:
            _fail(b, R.OUT_OF_MEMORY, f"{cause}; no more memory-frugal strategy is left to try")
            return plan, False
        why = f"{cause}; re-planned from {describe_plan(plan)} to {describe_plan(frugal)}; {_resume_note(job)}"
        frugal = frugal.model_copy(update={"replans": plan.replans + 1, "replan_reason": why})
        b.update(restarts=b.status.restarts + 1)
        b.cond(ConditionType.RESTARTING, True, R.REPLANNED, why, warn=True)
        return frugal, True
    if oom:
        _fail(b, R.OUT_OF_MEMORY, f"{cause}; failurePolicy.onOutOfMemory is Fail")
        return plan, False
    b.update(restarts=b.status.restarts + 1)
    b.cond(
        ConditionType.RESTARTING,
        True,
        R.RANK_FAILED,
        f"gang restart {b.status.restarts}/{policy.backoff_limit} from the last checkpoint: {cause}",
        warn=True,
    )
    return plan, True


def decide(
    job: FineTuneJob,
    observed: Observed,
    now: datetime,
    *,
    planner: Planner,
    replanner: Replanner,
    desired_config_hash: Callable[[PlanStatus], str],
    progress: Progress | None = None,
) -> Decision:
    """Everything the operator should do for this job now."""
    spec = job.spec
    b = _Builder(job, now)
    conditions = b.status.conditions
    nodes = spec.resources.num_nodes

    failed_condition = get(conditions, ConditionType.FAILED)
    fixable = failed_condition is not None and failed_condition.reason in (R.INVALID_SPEC, R.DOES_NOT_FIT)
    if fixable and b.status.observed_generation != job.metadata.generation:
        # the user edited a job that never started: plan it again
        b.update(conditions=[c for c in conditions if c.type != ConditionType.FAILED], completion_time=None)
        conditions = b.status.conditions
    elif is_true(conditions, ConditionType.SUCCEEDED) or is_true(conditions, ConditionType.FAILED):
        return _finished(b, job, now)

    plan = b.status.plan
    if plan is None or b.status.observed_generation != job.metadata.generation:
        try:
            fresh = planner(spec)
        except PlanFailed as exc:
            b.cond(ConditionType.PLANNED, False, exc.reason, str(exc))
            _fail(b, exc.reason, str(exc))
            return Decision(b.finish(), replicas=0, plan=None, events=b.events)
        if plan is not None:
            fresh = fresh.model_copy(update={"replans": plan.replans, "replan_reason": plan.replan_reason})
        plan = fresh
        b.update(plan=plan)
        b.cond(ConditionType.PLANNED, True, R.PLANNED, f"{describe_plan(plan)}. {plan.reason}".strip())

    if spec.suspend:
        b.cond(ConditionType.SUSPENDED, True, R.SUSPENDED, "spec.suspend is true: workers scaled to 0")
        b.cond(ConditionType.RUNNING, False, R.SUSPENDED, "")
        b.update(start_time=None, workers=Workers(ready=0, total=nodes, summary=f"0/{nodes}"))
        return Decision(b.finish(), replicas=0, plan=plan, events=b.events)
    if is_true(conditions, ConditionType.SUSPENDED):
        b.cond(ConditionType.SUSPENDED, False, R.RESUMED, "resumed from the last checkpoint", announce=True)

    start = _parse_ts(b.status.start_time)
    if start is None:
        b.update(start_time=b.now)
        start = now
    deadline = spec.active_deadline_seconds
    if deadline is not None and now - start >= timedelta(seconds=deadline):
        _fail(b, R.DEADLINE_EXCEEDED, f"running longer than activeDeadlineSeconds={deadline}")
        return Decision(b.finish(), replicas=0, plan=plan, events=b.events)

    pods = observed.live_pods
    restarted_at = _parse_ts(b.status.last_failure.time) if b.status.last_failure else None
    old_gang = [p for p in pods if restarted_at and (_parse_ts(p.created) or restarted_at) < restarted_at]
    if old_gang:
        # pods of the gang that failed are still alive: the deletion did not happen or is in flight
        pods = tuple(p for p in pods if p not in old_gang)
    ready = sum(1 for p in pods if p.ready and p.phase == "Running")
    b.update(workers=Workers(ready=ready, total=nodes, summary=f"{ready}/{nodes}"))
    if progress is not None:
        b.update(progress=progress)
    decision = Decision(b.status, replicas=nodes, plan=plan, delete_pods=bool(old_gang))
    if deadline is not None:  # come back exactly when the deadline passes
        decision.requeue_after = (start + timedelta(seconds=deadline) - now).total_seconds()
    completed = [p.completed for p in pods if p.failure is None and p.completed is not None]

    failed = _first_failure(pods)
    if len(pods) == nodes and len(completed) == nodes and {p.ordinal for p in pods} == set(range(nodes)):
        rank0 = next(p for p in pods if p.ordinal == 0)
        result = _result(rank0.completed or completed[0])
        b.update(result=result, completion_time=b.now, progress=_final_progress(b.status.progress, result, b.now))
        loss = f", final loss {result.final_loss:.4f}" if result.final_loss is not None else ""
        b.cond(ConditionType.SUCCEEDED, True, R.COMPLETED, f"all {nodes} ranks finished{loss}")
        b.cond(ConditionType.RUNNING, False, R.COMPLETED, "")
        b.cond(ConditionType.RESTARTING, False, R.COMPLETED, "")
        decision.replicas = 0
    elif failed is not None:
        plan, restart = _handle_failure(b, job, failed[0], failed[1], plan=plan, replanner=replanner)
        b.update(plan=plan)
        decision.plan, decision.delete_pods = plan, restart
        if not restart:
            decision.replicas = 0
        else:
            b.cond(ConditionType.RUNNING, False, R.GANG_RESTART, "restarting all ranks together")
    elif pods and any(p.config_hash != desired_config_hash(plan) for p in pods):
        decision.delete_pods = True
        b.cond(ConditionType.RESTARTING, True, R.CONFIG_CHANGED, "configuration changed: restarting all ranks")
        b.cond(ConditionType.RUNNING, False, R.CONFIG_CHANGED, "")
    elif len(pods) == nodes and ready == nodes:
        b.cond(ConditionType.RUNNING, True, R.ALL_RUNNING, f"{nodes} of {nodes} workers running")
        if is_true(b.status.conditions, ConditionType.RESTARTING):
            b.cond(ConditionType.RESTARTING, False, R.RECOVERED, "all ranks are back", announce=True)
    else:
        stuck = next((f"; {p.name}: {p.unschedulable}" for p in pods if p.unschedulable), "")
        b.cond(ConditionType.RUNNING, False, R.WAITING, f"{ready} of {nodes} workers ready{stuck}")
    decision.status = b.finish()
    decision.events = b.events
    return decision


def _finished(b: _Builder, job: FineTuneJob, now: datetime) -> Decision:
    decision = Decision(b.finish(), replicas=0, plan=b.status.plan)
    ttl = job.spec.ttl_seconds_after_finished
    done = _parse_ts(b.status.completion_time)
    if ttl is not None and done is not None:
        remaining = (done + timedelta(seconds=ttl) - now).total_seconds()
        if remaining <= 0:
            decision.delete_job = True
            decision.events.append(Event("Normal", R.EXPIRED, f"deleted {ttl}s after it finished"))
        else:
            decision.requeue_after = remaining
    return decision
