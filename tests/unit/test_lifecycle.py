"""The lifecycle decision, scenario by scenario, without a cluster."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import PlanStatus, Progress
from finetune_operator.api.strategy import Strategy
from finetune_operator.reconcile.decision import PlanFailed
from tests.support.lifecycle import NOW, exited, job_with, planner, pod, reasons, run, step, ts


def test_new_job_is_planned_and_waits_for_workers() -> None:
    decision = run(job_with(), [], sts=False)
    status = decision.status
    assert status.plan is not None and status.plan.zero_stage == 2
    assert decision.replicas == 2 and not decision.delete_pods
    assert status.state == "Planned"
    assert status.topology == "2×8"
    assert status.start_time == ts(NOW)
    assert "Planned" in reasons(decision)
    planned = next(e.message for e in decision.events if e.reason == "Planned")
    assert planned.startswith(str(Strategy.from_plan(status.plan))) and planned.count(" micro-batch ") == 1, planned


def test_all_ranks_ready_is_running_and_reports_workers() -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [pod(0), pod(1)])
    assert decision.status.state == "Running"
    assert decision.status.workers is not None and decision.status.workers.summary == "2/2"


def test_half_ready_is_not_running() -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [pod(0), pod(1, ready=False)])
    assert decision.status.state == "Planned"
    assert any(c.reason == "WaitingForWorkers" for c in decision.status.conditions)


def test_a_rank_that_finished_first_keeps_the_job_running_not_planned() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0), pod(1)])
    decision = run(job, [pod(0), pod(1, ready=False, state={"terminated": exited(0, reason="Completed")})])
    assert decision.status.state == "Running"
    running = next(c for c in decision.status.conditions if c.type == "Running")
    assert running.reason == "RanksFinishing" and running.message == "1 of 2 workers finished, 1 still running"
    # A finished rank beside one that is not ready yet is still waiting.
    decision = run(job, [pod(0, ready=False), pod(1, ready=False, state={"terminated": exited(0, reason="Completed")})])
    assert decision.status.state == "Planned"


def test_every_rank_exiting_zero_succeeds_with_the_summary_in_result() -> None:
    job, _ = step(job_with(), [])
    summary = json.dumps({"finalLoss": 0.25, "steps": 40, "tokens": 12345, "adapterUri": "/out/adapter"})
    decision = run(job, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    status = decision.status
    assert status.state == "Succeeded" and decision.replicas == 0
    assert status.result is not None and status.result.final_loss == 0.25 and status.result.steps == 40
    assert status.result.adapter_uri == "/out/adapter"
    assert status.completion_time == ts(NOW)
    assert status.progress is not None and status.progress.summary == "40/40 (100%)" and status.progress.loss == 0.25


def test_rank_failure_restarts_the_gang_and_counts_once() -> None:
    job, _ = step(job_with(), [])
    failing = [pod(0, state={"terminated": exited(1, "ValueError: bad batch")}), pod(1)]
    job, first = step(job, failing)
    assert first.delete_pods and first.status.restarts == 1
    assert first.status.state == "Restarting"
    assert first.status.last_failure is not None and "bad batch" in first.status.last_failure.message
    # the same failure seen again (deletion still in flight) is not counted twice
    job, again = step(job, failing)
    assert again.delete_pods and again.status.restarts == 1
    assert "GangRestart" not in reasons(again) and "RankFailed" not in reasons(again)


def test_a_new_gang_after_restart_recovers() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0, state={"terminated": exited(1, "boom")}), pod(1)])
    fresh = NOW + timedelta(seconds=30)
    job, decision = step(job, [pod(0, created=fresh), pod(1, created=fresh)], now=fresh)
    assert decision.status.state == "Running" and not decision.delete_pods
    assert "Recovered" in reasons(decision)


def test_old_gang_pods_left_behind_are_deleted_again() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0, state={"terminated": exited(1, "boom")}), pod(1)])
    later = NOW + timedelta(seconds=30)
    decision = run(job, [pod(0, created=later), pod(1)], now=later)
    assert decision.delete_pods and decision.status.restarts == 1


def test_backoff_limit_fails_with_the_root_cause() -> None:
    job, _ = step(job_with(failurePolicy={"backoffLimit": 1}), [])
    job, _ = step(job, [pod(0, state={"terminated": exited(2, "first")}), pod(1)])
    later = NOW + timedelta(minutes=1)
    decision = run(
        job, [pod(0, created=later), pod(1, created=later, last=exited(3, "NCCL timeout", at=later))], now=later
    )
    status = decision.status
    assert status.state == "Failed" and decision.replicas == 0 and not decision.delete_pods
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded" and "NCCL timeout" in failed.message


def test_terminal_job_is_never_restarted() -> None:
    job, _ = step(job_with(failurePolicy={"backoffLimit": 0}), [])
    job, decision = step(job, [pod(0, state={"terminated": exited(1)}), pod(1)])
    assert decision.status.state == "Failed"
    decision = run(job, [pod(0, state={"terminated": exited(1, at=NOW + timedelta(1))}), pod(1)])
    assert not decision.delete_pods and decision.replicas == 0 and decision.status.restarts == 0


@pytest.mark.parametrize(
    ("term", "oom"),
    [
        (exited(137, "", "OOMKilled"), True),
        (exited(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (exited(1, "RuntimeError: DefaultCPUAllocator: can't allocate memory"), True),
        (exited(1, "OutOfMemory: CUDA out of memory (rank 3)"), True),
        (exited(137, "RankKilled: rank 1 on node 1 died without an error message (SIGKILL, exit 137)"), False),
        (exited(137, "", "Error"), False),
        (  # NCCL pinning memory for InfiniBand: ENOMEM from the verbs library, no memory shortage
            exited(
                1,
                "NetworkError: NCCL could not register memory with the RDMA device: ... (DistBackendError: "
                "NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory)",
            ),
            False,
        ),
    ],
)
def test_out_of_memory_replans_to_a_more_frugal_strategy(term: dict[str, Any], oom: bool) -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [pod(0, state={"terminated": term}), pod(1)])
    plan = decision.status.plan
    assert plan is not None and decision.delete_pods
    assert (plan.zero_stage == 3) is oom
    assert (plan.replans == 1) is oom
    if oom:
        assert plan.replan_reason is not None and "ZeRO-2" in plan.replan_reason and "ZeRO-3" in plan.replan_reason
        assert "resumes from the last checkpoint, converted to the new strategy" in plan.replan_reason
        assert "OutOfMemoryReplanned" in reasons(decision)


def test_full_fine_tuning_replans_and_converts_its_checkpoint() -> None:
    """Full fine-tuning's shards are converted to a universal checkpoint where the stage changed;
    the re-plan's message says so instead of promising a resume only at the same stage."""
    job, _ = step(job_with(method={"type": "full"}, deepspeed={"zeroStage": "auto"}), [])
    decision = run(job, [pod(0, state={"terminated": exited(137, "", "OOMKilled")}), pod(1)])
    plan = decision.status.plan
    assert plan is not None and plan.replans == 1 and plan.replan_reason is not None, decision.status
    assert "converted to a universal checkpoint where the ZeRO stage or world size changed" in plan.replan_reason


def test_the_resumed_gang_announces_its_checkpoint_once_as_an_event() -> None:
    """After the OOM re-plan, rank 0's metrics say which checkpoint the new gang loaded and
    whether it was converted from another strategy: one Event, not one per scrape."""
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0), pod(1)], progress=Progress(step=3))
    job, replanned = step(job, [pod(0, state={"terminated": exited(137, "", "OOMKilled")}), pod(1)])
    assert "ResumedFromCheckpoint" not in reasons(replanned)
    new_gang = [pod(0, created=NOW + timedelta(seconds=5)), pod(1, created=NOW + timedelta(seconds=5))]
    resumed = Progress(step=9, resumed_from_step=8, checkpoint_converted=True)
    job, decision = step(job, new_gang, progress=resumed)
    event = next(e for e in decision.events if e.reason == "ResumedFromCheckpoint")
    assert event.type == "Normal"
    assert event.message == (
        "rank 0 resumed from the step-8 checkpoint under ZeRO-3, micro-batch 1 x accumulation 2; "
        "it was written under another strategy and converted"
    ), event.message
    assert job.status is not None and job.status.progress == resumed
    _, again = step(job, new_gang, progress=resumed.model_copy(update={"step": 10}))
    assert "ResumedFromCheckpoint" not in reasons(again)


def test_a_resume_no_scrape_saw_is_announced_from_the_summary() -> None:
    """A short resumed run can finish between two scrapes of rank 0's metrics: the trainer's
    summary carries the resume too, and success announces it once."""
    job, _ = step(job_with(), [])
    summary = json.dumps({"steps": 16, "tokens": 1, "resumedFromStep": 8, "checkpointConverted": False})
    decision = run(job, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    event = next(e for e in decision.events if e.reason == "ResumedFromCheckpoint")
    assert event.message.startswith("rank 0 resumed from the step-8 checkpoint under ZeRO-2, ")
    assert event.message.endswith("; it was written under the same strategy")
    progress = decision.status.progress
    assert progress is not None and (progress.resumed_from_step, progress.checkpoint_converted) == (8, False)
    # already reported by a scrape: no second Event
    assert job.status is not None
    scraped = job.model_copy(
        update={"status": job.status.model_copy(update={"progress": Progress(resumed_from_step=8)})}
    )
    decision = run(scraped, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    assert "ResumedFromCheckpoint" not in reasons(decision) and decision.status.state == "Succeeded"


def test_a_fresh_start_announces_no_resume() -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [pod(0), pod(1)], progress=Progress(step=1))
    assert "ResumedFromCheckpoint" not in reasons(decision)


def test_oom_with_nothing_more_frugal_fails() -> None:
    job, _ = step(job_with(deepspeed={"zeroStage": 3}), [])
    decision = run(job, [pod(0, state={"terminated": exited(137, "", "OOMKilled")}), pod(1)])
    assert decision.status.state == "Failed"
    assert next(c for c in decision.status.conditions if c.type == "Failed").reason == "OutOfMemory"


def test_oom_with_fail_policy_fails() -> None:
    job, _ = step(job_with(failurePolicy={"onOutOfMemory": "Fail"}), [])
    decision = run(job, [pod(0, state={"terminated": exited(137, "", "OOMKilled")}), pod(1)])
    assert decision.status.state == "Failed"


def test_suspend_scales_to_zero_and_resume_comes_back() -> None:
    job, _ = step(job_with(), [pod(0), pod(1)])
    suspended = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": True})})
    job, decision = step(suspended, [pod(0), pod(1)])
    assert decision.replicas == 0 and decision.status.state == "Suspended"
    resumed = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": False})})
    decision = run(resumed, [])
    assert decision.replicas == 2 and "Resumed" not in [
        c.reason for c in decision.status.conditions if c.status == "True"
    ]
    assert decision.status.state == "Planned"


def test_active_deadline_fails_the_job() -> None:
    job, _ = step(job_with(activeDeadlineSeconds=60), [])
    decision = run(job, [pod(0), pod(1)], now=NOW + timedelta(seconds=61))
    failed = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed.reason == "DeadlineExceeded" and decision.replicas == 0


def test_a_running_job_with_a_deadline_asks_to_be_looked_at_when_it_passes() -> None:
    job, _ = step(job_with(activeDeadlineSeconds=60), [])
    decision = run(job, [pod(0), pod(1)], now=NOW + timedelta(seconds=45))
    assert decision.status.state == "Running" and decision.requeue_after == pytest.approx(15)
    no_deadline, _ = step(job_with(), [])
    assert run(no_deadline, [pod(0), pod(1)], now=NOW + timedelta(seconds=45)).requeue_after is None


def test_ttl_deletes_the_finished_job_only_when_due() -> None:
    job, _ = step(job_with(ttlSecondsAfterFinished=100), [])
    job, _ = step(job, [pod(0, last=exited(0, "{}")), pod(1, last=exited(0, "{}"))])
    early = run(job, [], now=NOW + timedelta(seconds=50))
    assert not early.delete_job and early.requeue_after == pytest.approx(50)
    due = run(job, [], now=NOW + timedelta(seconds=100))
    assert due.delete_job


def test_config_change_restarts_the_gang_without_counting() -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [pod(0, config_hash="old"), pod(1, config_hash="old")])
    assert decision.delete_pods and decision.status.restarts == 0
    assert "ConfigChanged" in reasons(decision)


def test_a_reason_that_names_the_strategy_is_the_planned_message_as_it_is() -> None:
    def measured(spec: FineTuneJobSpec) -> PlanStatus:
        plan = planner(spec)
        return plan.model_copy(update={"reason": f"{Strategy.from_plan(plan)} fits: 1.0 GiB of 72.0 GiB usable"})

    decision = run(job_with(), [], sts=False, planner=measured)
    assert decision.status.plan is not None
    planned = next(e.message for e in decision.events if e.reason == "Planned")
    assert planned == decision.status.plan.reason


def test_plan_errors_become_failed_conditions() -> None:
    def no_fit(spec: FineTuneJobSpec) -> PlanStatus:
        raise PlanFailed("DoesNotFit", "needs 300 GiB per GPU; try qlora or 8 more GPUs")

    decision = run(job_with(), [], sts=False, planner=no_fit)
    failed = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed.reason == "DoesNotFit" and "qlora" in failed.message
    assert decision.replicas == 0 and decision.status.state == "Failed"


def test_spec_change_replans_but_keeps_counters() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0, state={"terminated": exited(1, "x")}), pod(1)])
    changed = job.model_copy(update={"metadata": job.metadata.model_copy(update={"generation": 2})})
    decision = run(changed, [])
    assert decision.status.restarts == 1 and decision.status.observed_generation == 2


def test_transition_times_move_only_on_flips() -> None:
    job, _ = step(job_with(), [])
    job, first = step(job, [pod(0), pod(1)])
    later = NOW + timedelta(minutes=3)
    second = run(job, [pod(0), pod(1)], now=later)
    running = next(c for c in second.status.conditions if c.type == "Running")
    assert running.last_transition_time == ts(NOW)
    assert second.status == first.status or second.events == ()


def test_odd_pod_bodies_do_not_crash() -> None:
    job, _ = step(job_with(), [])
    weird: list[dict[str, Any]] = [{}, {"metadata": None}, {"status": {"containerStatuses": [None, 3]}}]
    decision = run(job, weird)
    assert decision.status.workers is not None and decision.status.workers.ready == 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("DataError: /data/d.jsonl:7: malformed alpaca record: missing field 'output' (rank 0)", "DataError"),
        ("ConfigError: spec.method.lora.dropout: 0.05 cannot apply to this model (rank 1)", "ConfigError"),
    ],
)
def test_a_failure_that_would_repeat_fails_at_once_without_spending_restarts(line: str, reason: str) -> None:
    job, _ = step(job_with(failurePolicy={"backoffLimit": 3}), [])
    decision = run(job, [pod(0, state={"terminated": exited(1, line)}), pod(1)])
    status = decision.status
    assert status.state == "Failed" and decision.replicas == 0 and not decision.delete_pods
    assert status.restarts == 0
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == reason and line.partition(" (rank")[0] in failed.message and "not retried" in failed.message
    assert reason in reasons(decision)


@pytest.mark.parametrize(
    "line",
    [
        "DataUnavailable: hf://org/set: cannot load dataset from the hub: ConnectionError (rank 0)",
        "ModelNotFound: cannot load model from /models/m: no such file (rank 0)",
        "TrainingError: RuntimeError: NCCL watchdog timeout (rank 0)",
        "see DataError: in the middle of a line is not a root cause",
    ],
)
def test_failures_a_restart_may_cure_are_retried(line: str) -> None:
    job, _ = step(job_with(), [])
    decision = run(job, [pod(0, state={"terminated": exited(1, line)}), pod(1)])
    assert decision.delete_pods and decision.status.restarts == 1 and decision.status.state == "Restarting"
