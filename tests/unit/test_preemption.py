"""A preemption costs no work and no restart: the operator's side.

Ranks that stopped on SIGTERM after saving a checkpoint end `Preempted: ...` (the trainer's
`preemption`): the gang restarts from it, counted in `status.preemptions`, never in `restarts`
nor against the backoff limit. The pods' grace period is sized for that save: from the plan until
rank 0 has measured one, from the measurement after.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from finetune_operator.api import FineTuneJob
from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.status import FineTuneJobStatus, PlanStatus, Progress
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.reconcile.progress import Sample, parse, to_progress
from finetune_operator.render.manifests import gang_hash, render_all
from finetune_operator.render.options import RenderOptions
from finetune_operator.render.stop_grace import (
    ASSUMED_WRITE_BYTES_PER_SECOND,
    CEILING_SECONDS,
    MARGIN_SECONDS,
    RESERVE_SECONDS,
    SAVE_MARGIN,
    termination_grace_seconds,
)
from tests.support.lifecycle import NOW, exited, job_with, pod, reasons, run, step

PREEMPTED = (
    "Preempted: asked to stop (SIGTERM); stopped at the boundary of step 7 of 40 after saving checkpoint "
    "step-00000007: no step is lost"
)


def _stopped(ordinal: int, at: Any = NOW, **kw: Any) -> dict[str, Any]:
    """A pod whose trainer stopped `Preempted` (the kubelet restarted its container since)."""
    return pod(ordinal, ready=False, last=exited(143, PREEMPTED, at=at), restarts=1, **kw)


def test_a_preempted_gang_restarts_without_spending_the_restart_budget() -> None:
    job, _ = step(job_with(failurePolicy={"backoffLimit": 0}), [])
    job, _ = step(job, [pod(0), pod(1)])
    job, first = step(job, [_stopped(0), _stopped(1)])
    status = first.status
    assert first.delete_pods and first.replicas == 2, "a gang restart, not a failed job"
    assert (status.preemptions, status.restarts, status.state) == (1, 0, "Restarting")
    assert status.last_failure is None
    assert status.last_preemption is not None and "step-00000007" in status.last_preemption.message
    assert "Preempted" in reasons(first)
    restarting = next(c for c in status.conditions if c.type == "Restarting")
    assert restarting.reason == "Preempted" and "restarts unchanged" in restarting.message
    # seen again while the deletion is in flight: counted once
    job, again = step(job, [_stopped(0), _stopped(1)])
    assert again.delete_pods and again.status.preemptions == 1 and not reasons(again)
    # the new gang comes up: recovered, and the old pods' stops are not counted again
    fresh = NOW + timedelta(seconds=30)
    job, back = step(job, [pod(0, created=fresh), pod(1, created=fresh)], now=fresh)
    assert back.status.state == "Running" and not back.delete_pods and "Recovered" in reasons(back)
    assert (back.status.preemptions, back.status.restarts) == (1, 0)


def test_preemptions_never_exhaust_the_backoff_limit_and_failures_still_do() -> None:
    job, _ = step(job_with(failurePolicy={"backoffLimit": 1}), [])
    at = NOW
    for n in range(1, 4):  # three evictions in a row: each a new gang, each counted once
        at += timedelta(minutes=1)
        job, decision = step(job, [_stopped(0, at=at, created=at), _stopped(1, at=at, created=at)], now=at)
        assert decision.delete_pods and decision.status.state == "Restarting"
        assert (decision.status.preemptions, decision.status.restarts) == (n, 0)
    at += timedelta(minutes=1)
    failing = [pod(0, created=at, state={"terminated": exited(1, "TrainingError: boom", at=at)}), pod(1, created=at)]
    job, failed = step(job, failing, now=at)
    assert (failed.status.restarts, failed.status.preemptions, failed.status.state) == (1, 3, "Restarting")


def test_a_real_failure_beside_a_preempted_pod_is_a_failure() -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [_stopped(0), pod(1, state={"terminated": exited(1, "TrainingError: boom")})])
    assert (decision.status.restarts, decision.status.preemptions) == (1, 0)
    assert decision.status.last_failure is not None and "boom" in decision.status.last_failure.message


# ---- the grace period ---------------------------------------------------------------------------


def _plan(job: FineTuneJob, trainable: int, step_seconds: float | None = None) -> PlanStatus:
    return fixed_plan(job.spec).model_copy(
        update={"trainable_parameters": trainable, "estimated_step_seconds": step_seconds}
    )


def _measured(job: FineTuneJob, seconds: float | None) -> FineTuneJob:
    return job.model_copy(update={"status": FineTuneJobStatus(progress=Progress(checkpoint_save_seconds=seconds))})


def _pod_spec(job: FineTuneJob, plan: PlanStatus) -> dict[str, Any]:
    sts = next(o for o in render_all(job, plan, RenderOptions(), 2) if o["kind"] == "StatefulSet")
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def _stop_env(pod_spec: dict[str, Any]) -> str:
    env = pod_spec["containers"][0]["env"]
    return str(next(e["value"] for e in env if e["name"] == PodEnv.FTJOB_STOP_GRACE_SECONDS))


def test_before_a_save_is_measured_the_grace_is_estimated_from_the_plan() -> None:
    job = job_with()
    trainable = 4 * 10**9  # a LoRA this large writes 48 GB: 12 bytes a parameter
    plan = _plan(job, trainable, step_seconds=20.0)
    save = trainable * 12 / ASSUMED_WRITE_BYTES_PER_SECOND
    expected = int(-(-(20.0 + SAVE_MARGIN * save + MARGIN_SECONDS) // 1))
    assert termination_grace_seconds(job, plan, 60) == expected > 60
    spec = _pod_spec(job, plan)
    assert spec["terminationGracePeriodSeconds"] == expected
    assert _stop_env(spec) == str(expected - RESERVE_SECONDS)
    # staged, then uploaded: twice the writing
    on_s3 = job_with(output={"uri": "s3://bucket/run"}, objectStorage={"credentials": {"secretName": "keys"}})
    assert termination_grace_seconds(on_s3, plan, 60) > expected


def test_full_fine_tuning_writes_its_optimizer_share_and_the_weights() -> None:
    lora, full = job_with(), job_with(method={"type": "full"})
    plan = _plan(lora, 10**9)
    assert termination_grace_seconds(full, plan, 0) > termination_grace_seconds(lora, plan, 0) / 2
    assert termination_grace_seconds(full, plan, 0) < termination_grace_seconds(lora, plan, 0)  # 12/2 + 2 < 12


@pytest.mark.parametrize(
    ("trainable", "floor", "expected"),
    [(10**5, 60, 60), (10**5, 300, 300), (10**12, 60, CEILING_SECONDS)],
    ids=["floor", "operator-floor", "ceiling"],
)
def test_the_grace_stays_between_the_floor_and_the_ceiling(trainable: int, floor: int, expected: int) -> None:
    job = job_with()
    assert termination_grace_seconds(job, _plan(job, trainable), floor) == expected


def test_a_measured_save_replaces_the_estimate_without_restarting_the_gang() -> None:
    job = job_with()
    plan = _plan(job, 4 * 10**9)
    measured = _measured(job, 100.0)
    grace = int(SAVE_MARGIN * 100.0 + MARGIN_SECONDS)
    assert termination_grace_seconds(measured, plan, 60) == grace
    assert _pod_spec(measured, plan)["terminationGracePeriodSeconds"] == grace
    assert _stop_env(_pod_spec(measured, plan)) == str(grace - RESERVE_SECONDS)
    # the figure is no part of what a rank runs: the running gang is not stale
    options = RenderOptions()
    assert (
        gang_hash(measured, plan, options)
        == gang_hash(job, plan, options)
        == gang_hash(_measured(job, 1.0), plan, options)
    )


def test_rank_0s_save_times_reach_the_status_and_outlive_a_restart() -> None:
    from finetune_trainer.metrics.progress import ProgressMetrics

    registry = CollectorRegistry()
    metrics = ProgressMetrics(registry, {"rank": "0"})
    metrics.global_step.set(9)
    metrics.checkpoint_done(3.0)
    metrics.checkpoint_done(5.0)
    values = parse(generate_latest(registry).decode())
    assert values is not None
    assert to_progress(NOW, Sample(at=1.0, values=values), None).checkpoint_save_seconds == 4.0
    fresh = ProgressMetrics(CollectorRegistry(), {"rank": "0"})  # a restarted rank 0, before its first save
    assert (
        to_progress(
            NOW, Sample(at=1.0, values=parse(generate_latest(fresh.registry).decode()) or {}), None
        ).checkpoint_save_seconds
        is None
    )

    job, _ = step(job_with(), [])
    saved = Progress(step=9, checkpoint_save_seconds=4.0)
    job, _ = step(job, [pod(0), pod(1)], progress=saved)
    assert job.status is not None and job.status.progress is not None
    job, decision = step(job, [pod(0), pod(1)], progress=Progress(step=10))
    assert decision.status.progress is not None and decision.status.progress.step == 10
    assert decision.status.progress.checkpoint_save_seconds == 4.0
