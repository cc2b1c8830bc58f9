"""The job's MLflow run in `status.result.tracking`, and Events when publishing to it fails.

Rank 0 names the run and says whether it can publish (see `reconcile.tracking`); this policy
copies that into the status while the gang runs; it decides nothing. Tracking never
fails a job: a server that is down or refuses the credentials is a Warning Event
(`TrackingFailing`) while the records wait on the output volume, and a Normal one
(`TrackingRecovered`) once they flow again. At success the trainer's summary has the last
word; records it could not send before the job ended are a Warning (`TrackingIncomplete`).
"""

from __future__ import annotations

from ...api import reasons as R
from ...api.status import Result
from ...api.tracking import TrackingResult
from ..tracking import TrackingReport
from .status_builder import StatusBuilder


def _server(report: TrackingReport | None) -> str:
    return f" at {report.tracking_uri}" if report is not None and report.tracking_uri else ""


def _merged(old: TrackingResult | None, new: TrackingResult) -> TrackingResult:
    """`new` with what it does not know yet (a new gang names its run once it reached the server) kept."""
    if old is None:
        return new
    keep = {k: v for k, v in old.model_dump().items() if v is not None and k not in ("failing", "reason")}
    return new.model_copy(update={**keep, **{k: v for k, v in new.model_dump().items() if v is not None}})


def _set(b: StatusBuilder, tracking: TrackingResult) -> None:
    b.update(result=(b.status.result or Result()).model_copy(update={"tracking": tracking}))


def record(report: TrackingReport | None, b: StatusBuilder) -> None:
    """While the gang runs: rank 0's latest report into the status (None: no news this pass)."""
    if report is None:
        return
    old = b.status.result.tracking if b.status.result else None
    was_failing = bool(old and old.failing)
    tracking = _merged(old, report.result)
    if tracking.failing and not was_failing:
        b.event(
            R.TRACKING_FAILING,
            f"rank 0 cannot publish to MLflow{_server(report)} ({tracking.reason or 'no answer'}); training goes on, "
            f"and the {report.pending} records waiting on the output volume are sent when the server answers",
            warn=True,
        )
    elif was_failing and tracking.failing is False:
        b.event(R.TRACKING_RECOVERED, f"MLflow{_server(report)} answers again; the waiting records are being sent")
    _set(b, tracking)


def at_success(b: StatusBuilder, result: Result) -> Result:
    """The finished job's result with its run: the summary's, completed by what the status already knew."""
    old = b.status.result.tracking if b.status.result else None
    final = result.tracking
    if final is None:
        if old is None:
            return result
        return result.model_copy(update={"tracking": old.model_copy(update={"failing": None, "reason": None})})
    tracking = _merged(old, final).model_copy(update={"failing": None, "reason": final.reason})
    if final.unpublished_records:
        b.event(
            R.TRACKING_INCOMPLETE,
            f"{final.unpublished_records} records were not published to MLflow before the job ended "
            f"({final.reason or 'no answer'}); they are kept in the output folder's tracking/records.jsonl",
            warn=True,
        )
    return result.model_copy(update={"tracking": tracking})
