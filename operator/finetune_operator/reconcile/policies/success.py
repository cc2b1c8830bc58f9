"""Success: every rank of the current gang exited 0. Rank 0's summary becomes `status.result`
and the final progress (a short run may finish between two scrapes, so a resume no scrape saw
is announced here); the workers are scaled to 0 so the GPUs are free."""

from __future__ import annotations

from ...api import reasons as R
from ...api.pod_contract import TrainingSummary
from ...api.reasons import ConditionType
from ...api.status import Progress, Result
from .. import termination
from .gang import announce_resume
from .phases import Action, Gang
from .status_builder import StatusBuilder
from .tracking import at_success


def _final_progress(progress: Progress | None, result: Result, now: str, summary: TrainingSummary | None) -> Progress:
    steps = result.steps if result.steps is not None else (progress.step if progress else 0)
    resumed = summary if summary is not None and summary.resumed_from_step is not None else progress
    final_eval = summary.eval_preference_accuracy if summary is not None else None
    return Progress(
        step=steps,
        total_steps=steps,
        epoch=progress.epoch if progress else None,
        loss=round(result.final_loss, 4) if result.final_loss is not None else (progress.loss if progress else None),
        # a preference job's last scraped rewards; its final evaluation from the summary when it has one
        preference_accuracy=progress.preference_accuracy if progress else None,
        reward_margin=progress.reward_margin if progress else None,
        rewards_chosen=progress.rewards_chosen if progress else None,
        rewards_rejected=progress.rewards_rejected if progress else None,
        eval_preference_accuracy=round(final_eval, 4)
        if final_eval is not None
        else (progress.eval_preference_accuracy if progress else None),
        percent=100,
        eta_seconds=0,
        summary=f"{steps}/{steps} (100%)",
        skipped_records=result.skipped_records,
        resumed_from_step=resumed.resumed_from_step if resumed else None,  # an older trainer's summary lacks it
        checkpoint_converted=resumed.checkpoint_converted if resumed else None,
        last_update_time=now,
    )


def decide(gang: Gang, b: StatusBuilder) -> Action | None:
    pods, nodes = gang.pods, gang.nodes
    completed = [p.completed for p in pods if p.failure is None and p.completed is not None]
    if not (len(pods) == nodes and len(completed) == nodes and {p.ordinal for p in pods} == set(range(nodes))):
        return None
    rank0 = next(p for p in pods if p.ordinal == 0)
    summary = termination.summary_of(rank0.completed or completed[0])
    result = at_success(b, summary.to_result() if summary is not None else Result())
    if summary is not None:
        resumed, converted = summary.resumed_from_step, bool(summary.checkpoint_converted)
        announce_resume(b, gang.plan, b.status.progress, resumed, converted)
    b.update(result=result, completion_time=b.now, progress=_final_progress(b.status.progress, result, b.now, summary))
    loss = f", final loss {result.final_loss:.4f}" if result.final_loss is not None else ""
    b.cond(ConditionType.SUCCEEDED, True, R.COMPLETED, f"all {nodes} ranks finished{loss}")
    b.cond(ConditionType.RUNNING, False, R.COMPLETED, "")
    b.cond(ConditionType.RESTARTING, False, R.COMPLETED, "")
    return gang.scale_down()
