"""A rank failed: restart the whole gang from the last checkpoint, counted once against
`failurePolicy.backoffLimit` (a fingerprint of the failed container run identifies it, so an
operator restart neither loses nor double-counts it). An out-of-memory error re-plans to the
next more frugal strategy; a root cause a restart cannot change fails the job at once."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.spec import OomAction
from ...api.status import LastFailure, PlanStatus
from ...api.strategy import Strategy
from .. import termination
from ..observed import PodView, Termination
from .phases import Action, Gang, Inputs
from .status_builder import StatusBuilder


def _first_failure(pods: tuple[PodView, ...]) -> tuple[PodView, Termination] | None:
    """The first failed pod; one that stopped `Preempted` only when no pod failed for real."""
    failed = [(pod, term) for pod in pods if (term := pod.failure) is not None]
    real = [(pod, term) for pod, term in failed if not termination.is_preempted(term)]
    first = real or failed
    return first[0] if first else None


def _resume_note(inputs: Inputs) -> str:
    """What the new gang does with the checkpoint after a re-plan (the trainer logs the details)."""
    if inputs.job.spec.method.traits.base_trains:
        return (
            "the new gang resumes from the last checkpoint, converted to a universal checkpoint where the "
            "ZeRO stage or world size changed"
        )
    return "the new gang resumes from the last checkpoint, converted to the new strategy"


def _handle(
    inputs: Inputs, b: StatusBuilder, pod: PodView, term: Termination, plan: PlanStatus
) -> tuple[PlanStatus, bool]:
    """Count the failure once; returns the plan to run and whether to restart the gang."""
    fingerprint = pod.fingerprint(term)
    last = b.status.last_failure
    if last is not None and last.fingerprint == fingerprint:
        return plan, True  # already counted; the deletion may not have happened yet
    cause = termination.root_cause(term, pod.name)
    oom = termination.is_out_of_memory(term)
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
    policy = inputs.job.spec.failure_policy
    permanent = termination.not_retried(term)
    if permanent is not None:
        b.fail(permanent, f"{cause}; not retried: a restart would fail the same way (fix it in a new job)")
        return plan, False
    if b.status.restarts >= policy.backoff_limit:
        b.fail(R.BACKOFF_EXCEEDED, f"{b.status.restarts} restarts used of {policy.backoff_limit}; last: {cause}")
        return plan, False
    if oom and policy.on_out_of_memory == OomAction.REPLAN:
        frugal = inputs.replanner(inputs.job.spec, plan)
        if frugal is None:
            b.fail(R.OUT_OF_MEMORY, f"{cause}; no more memory-frugal strategy is left to try")
            return plan, False
        before, after = Strategy.from_plan(plan), Strategy.from_plan(frugal)
        why = f"{cause}; re-planned from {before} to {after}; {_resume_note(inputs)}"
        frugal = frugal.model_copy(update={"replans": plan.replans + 1, "replan_reason": why})
        b.update(restarts=b.status.restarts + 1)
        b.cond(ConditionType.RESTARTING, True, R.REPLANNED, why, warn=True)
        return frugal, True
    if oom:
        b.fail(R.OUT_OF_MEMORY, f"{cause}; failurePolicy.onOutOfMemory is Fail")
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


def decide(gang: Gang, b: StatusBuilder) -> Action | None:
    failed = _first_failure(gang.pods)
    if failed is None:
        return None
    plan, restart = _handle(gang.inputs, b, failed[0], failed[1], gang.plan)
    b.update(plan=plan)
    if not restart:
        return Action(replicas=0, plan=plan, delete_pods=False)
    b.cond(ConditionType.RUNNING, False, R.GANG_RESTART, "restarting all ranks together")
    return gang.restart(plan)
