"""Success: every rank of the current gang exited 0. Rank 0's summary becomes `status.result`
and the final progress (a short run may finish between two scrapes); the workers are scaled
to 0 so the GPUs are free."""

from __future__ import annotations

from ...api.status import ConditionType, Progress, Result
from .. import reasons as R
from ..observed import Termination
from .context import Context, Decision


def _result(term: Termination) -> Result:
    summary = R.summary_of(term)
    return summary.to_result() if summary is not None else Result()


def _final_progress(progress: Progress | None, result: Result, now: str) -> Progress:
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


def decide(ctx: Context) -> Decision | None:
    b, pods, nodes = ctx.status, ctx.pods, ctx.nodes
    completed = [p.completed for p in pods if p.failure is None and p.completed is not None]
    if not (len(pods) == nodes and len(completed) == nodes and {p.ordinal for p in pods} == set(range(nodes))):
        return None
    rank0 = next(p for p in pods if p.ordinal == 0)
    result = _result(rank0.completed or completed[0])
    b.update(result=result, completion_time=b.now, progress=_final_progress(b.status.progress, result, b.now))
    loss = f", final loss {result.final_loss:.4f}" if result.final_loss is not None else ""
    b.cond(ConditionType.SUCCEEDED, True, R.COMPLETED, f"all {nodes} ranks finished{loss}")
    b.cond(ConditionType.RUNNING, False, R.COMPLETED, "")
    b.cond(ConditionType.RESTARTING, False, R.COMPLETED, "")
    decision = ctx.workers_decision
    decision.replicas = 0
    return decision
