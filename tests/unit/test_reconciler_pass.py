"""One reconciler pass reads the clock once and serialises each status it decides once.

Every time a pass writes (condition transitions, start, completion, the counted failure) is
the one reading of the reconciler's clock, even when the pass decides twice (once on the
cached job, again on the newest before acting on a running gang). The in-memory cluster of
`tests.support.cluster` stands in for the apiserver; decide, plan and render are the real code.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from finetune_operator.api.status import FineTuneJobStatus
from finetune_operator.reconcile import lifecycle, runner
from finetune_operator.reconcile.observed import observe
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.support.cluster import FakeCluster, config_hash_of, statefulset_of, stored_job
from tests.support.lifecycle import exited, pod

START = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
SUMMARY = '{"finalLoss": 0.5, "steps": 10, "tokens": 100}'


class Clock:
    """A clock that says `at` and counts how often it was read."""

    def __init__(self, at: datetime) -> None:
        self.at, self.reads = at, 0

    def __call__(self) -> datetime:
        self.reads += 1
        return self.at


def _stamps(status: dict[str, Any]) -> set[str]:
    stamps = {c["lastTransitionTime"] for c in status["conditions"]}
    return stamps | {status[key] for key in ("startTime", "completionTime") if key in status}


def _started() -> tuple[FakeCluster, Reconciler, Clock, dict[str, Any]]:
    store, clock = FakeCluster(stored_job()), Clock(START)
    reconciler = Reconciler(store, RenderOptions(trainer_image="t"), lambda *_: None, clock=clock)
    reconciler.reconcile(store.job(), observe(None, []))
    return store, reconciler, clock, statefulset_of(store.applied[-1])


def test_every_time_a_pass_writes_is_its_one_reading_of_the_clock() -> None:
    store, reconciler, clock, sts = _started()
    assert clock.reads == 1
    assert _stamps(store.body["status"]) == {"2026-03-01T08:00:00Z"}

    clock.at = START + timedelta(minutes=30)
    done = [
        pod(i, config_hash=config_hash_of(sts), state={"terminated": exited(0, SUMMARY, "Completed")}) for i in (0, 1)
    ]
    reads_before, job_reads_before = clock.reads, store.reads
    reconciler.reconcile(store.job(), observe(sts, done))
    assert store.reads == job_reads_before + 1, "the scale-down is decided again on the newest job"
    assert clock.reads == reads_before + 1
    status = store.body["status"]
    assert status["state"] == "Succeeded"
    assert status["completionTime"] == "2026-03-01T08:30:00Z"
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert succeeded["lastTransitionTime"] == "2026-03-01T08:30:00Z"
    assert status["startTime"] == "2026-03-01T08:00:00Z"


def test_a_pass_serialises_each_status_it_decides_once(monkeypatch: pytest.MonkeyPatch) -> None:
    store, reconciler, _, sts = _started()
    serialised, decided = 0, 0
    to_wire, decide = FineTuneJobStatus.to_wire, lifecycle.decide

    def counting_to_wire(status: FineTuneJobStatus) -> dict[str, Any]:
        nonlocal serialised
        serialised += 1
        return to_wire(status)

    def counting_decide(*args: Any, **kwargs: Any) -> Any:
        nonlocal decided
        decided += 1
        return decide(*args, **kwargs)

    monkeypatch.setattr(FineTuneJobStatus, "to_wire", counting_to_wire)
    monkeypatch.setattr(runner, "decide", counting_decide)
    done = [
        pod(i, config_hash=config_hash_of(sts), state={"terminated": exited(0, SUMMARY, "Completed")}) for i in (0, 1)
    ]
    outcome = reconciler.reconcile(store.job(), observe(sts, done))
    assert outcome.wrote_status and outcome.applied and store.body["status"]["state"] == "Succeeded"
    assert decided == 2, "decided on the cached job, then on the newest"
    assert serialised == decided
