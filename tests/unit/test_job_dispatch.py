"""Events → passes: what the kopf handlers hand over, driven without kopf.

A recording reconciler stands in for the real one (which the cluster tier exercises
against a real apiserver); what is checked here is the wiring: which event causes a pass,
with which body and children, how often, and when the next unprompted pass comes. The work
queue runs on a `FakeClock`: the tests move time and wait until the queue is idle, so "no
pass" is checked once everything due has run, and "not before the interval" exactly.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from finetune_operator.api.reasons import State
from finetune_operator.api.status import FineTuneJobStatus
from finetune_operator.handlers.dispatch import POKE_DELAY_SECONDS, HandlerSettings, JobHandlers, next_pass
from finetune_operator.reconcile.decision import Decision
from finetune_operator.reconcile.observed import Observed, PodView, WorkersView
from finetune_operator.reconcile.runner import Outcome
from finetune_operator.render.identity import JOB_NAME_LABEL
from tests.support.clock import WAIT_LIMIT_S, FakeClock


@dataclass
class Call:
    body: dict[str, Any]
    observed: Observed
    apply_all: bool


@dataclass
class RecordingReconciler:
    state: State = State.RUNNING
    requeue_after: float | None = None
    calls: list[Call] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reconcile(self, body: Mapping[str, Any], observed: Observed, apply_all: bool = False) -> Outcome:
        with self.lock:
            self.calls.append(Call(dict(body), observed, apply_all))
        decision = Decision(status=FineTuneJobStatus(state=self.state), replicas=1, plan=None)
        return Outcome(decision, False, False, self.requeue_after)

    def forget(self, uid: str) -> None:
        self.forgotten.append(uid)

    own_writes: set[tuple[str, str]] = field(default_factory=set)

    def is_own_write(self, uid: str, resource_version: str) -> bool:
        return (uid, resource_version) in self.own_writes


def job_event(name: str, rv: str, type_: str | None = "MODIFIED") -> dict[str, Any]:
    body = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"x": rv},
    }
    return {"type": type_, "namespace": "ns", "name": name, "uid": f"uid-{name}", "body": body}


def pod_event(job: str) -> dict[str, Any]:
    return {"type": "MODIFIED", "namespace": "ns", "labels": {JOB_NAME_LABEL: job}}


def _pod(name: str, owner: str | None) -> PodView:
    return PodView(name, f"uid-{name}", 0, "Running", True, None, 0, False, None, "", None, None, None, owner_uid=owner)


WORKERS = WorkersView(replicas=1, config_hash=None, uid="sts-a", name="a", owner_uid="uid-a")
FOREIGN_STS = WorkersView(replicas=1, config_hash=None, uid="sts-x", name="x", owner_uid=None)
OWNED_POD, FOREIGN_POD = _pod("a-0", "sts-a"), _pod("a-1", None)


@pytest.fixture
def reconciler() -> RecordingReconciler:
    return RecordingReconciler()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def handlers(reconciler: RecordingReconciler, clock: FakeClock) -> Iterator[JobHandlers]:
    settings = HandlerSettings(interval_seconds=60, resync_seconds=600, max_workers=4)
    jobs = JobHandlers(reconciler, settings, clock=clock)
    jobs.bind(pods={("ns", "a"): [OWNED_POD, FOREIGN_POD]}, workers={("ns", "a"): [FOREIGN_STS, WORKERS]})
    jobs.start()
    yield jobs
    jobs.stop()


def run(coro: Any) -> None:
    asyncio.run(coro)


def test_first_sight_applies_every_child_then_later_passes_do_not(
    handlers: JobHandlers, reconciler: RecordingReconciler, clock: FakeClock
) -> None:
    run(handlers.on_job(job_event("a", "1", type_=None)))  # the initial listing after a start
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 1
    run(handlers.on_job(job_event("a", "2")))
    clock.settle(handlers.queue)
    assert [c.apply_all for c in reconciler.calls] == [True, False]
    assert reconciler.calls[1].body["metadata"]["resourceVersion"] == "2"
    assert "managedFields" not in reconciler.calls[1].body["metadata"]  # not kept in memory
    # children come from the live index, and only those the job controls
    assert reconciler.calls[0].observed.pods == (OWNED_POD,)
    assert reconciler.calls[0].observed.workers == WORKERS


def test_a_pod_event_reconciles_its_job_with_the_newest_body(
    handlers: JobHandlers, reconciler: RecordingReconciler, clock: FakeClock
) -> None:
    run(handlers.on_job(job_event("a", "7")))
    clock.settle(handlers.queue)
    run(handlers.on_child(pod_event("a")))
    clock.advance(POKE_DELAY_SECONDS)
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 2
    assert reconciler.calls[1].body["metadata"]["resourceVersion"] == "7"


def test_a_burst_of_pod_events_is_one_pass(
    handlers: JobHandlers, reconciler: RecordingReconciler, clock: FakeClock
) -> None:
    run(handlers.on_job(job_event("a", "1")))
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 1

    async def burst() -> None:
        for _ in range(30):
            await handlers.on_child(pod_event("a"))

    run(burst())
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 1  # merged, and waiting out the poke delay
    clock.advance(POKE_DELAY_SECONDS)
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 2
    clock.advance(30)  # well inside the 60 s interval
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 2


def test_the_echo_of_our_own_status_write_is_stored_but_causes_no_pass(
    handlers: JobHandlers, reconciler: RecordingReconciler, clock: FakeClock
) -> None:
    run(handlers.on_job(job_event("a", "1")))
    clock.settle(handlers.queue)
    reconciler.own_writes.add(("uid-a", "2"))  # the pass wrote status; the apiserver answered rv 2
    run(handlers.on_job(job_event("a", "2")))
    clock.advance(30)  # well inside the 60 s interval
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 1
    run(handlers.on_child(pod_event("a")))  # the next pass sees the newest body all the same
    clock.advance(POKE_DELAY_SECONDS)
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 2
    assert reconciler.calls[1].body["metadata"]["resourceVersion"] == "2"
    run(handlers.on_job(job_event("a", "3")))  # anyone else's change is a pass
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 3


def test_a_new_job_is_reconciled_before_status_passes_of_known_ones(
    reconciler: RecordingReconciler, clock: FakeClock
) -> None:
    """In a burst of creations, children of new jobs are not queued behind pod-event passes."""
    holding, gate = threading.Event(), threading.Event()
    original = reconciler.reconcile

    def held(body: Mapping[str, Any], observed: Observed, apply_all: bool = False) -> Outcome:
        if body["metadata"]["name"] == "hold":
            holding.set()
            gate.wait(WAIT_LIMIT_S)
        return original(body, observed, apply_all)

    reconciler.reconcile = held  # type: ignore[method-assign]
    settings = HandlerSettings(interval_seconds=60, resync_seconds=600, max_workers=1)
    jobs = JobHandlers(reconciler, settings, clock=clock)
    jobs.bind(pods={}, workers={})
    jobs.start()
    try:
        for name in ("a", "b"):
            run(jobs.on_job(job_event(name, "1")))
        clock.settle(jobs.queue)
        assert len(reconciler.calls) == 2
        run(jobs.on_job(job_event("hold", "1")))  # occupies the only worker
        assert holding.wait(WAIT_LIMIT_S)
        run(jobs.on_child(pod_event("a")))
        run(jobs.on_child(pod_event("b")))
        clock.advance(POKE_DELAY_SECONDS)  # their pokes are due
        run(jobs.on_job(job_event("new", "1")))
        gate.set()
        clock.settle(jobs.queue)
        names = [c.body["metadata"]["name"] for c in reconciler.calls[2:]]
        assert names == ["hold", "new", "a", "b"]
        assert reconciler.calls[3].apply_all
    finally:
        jobs.stop()


def test_children_of_an_unknown_job_cause_no_pass(
    handlers: JobHandlers, reconciler: RecordingReconciler, clock: FakeClock
) -> None:
    run(handlers.on_child(pod_event("stranger")))
    clock.advance(POKE_DELAY_SECONDS)
    clock.settle(handlers.queue)
    assert reconciler.calls == []
    assert len(handlers.queue) == 0  # and the queue keeps nothing of it


def test_deletion_forgets_the_job(handlers: JobHandlers, reconciler: RecordingReconciler, clock: FakeClock) -> None:
    run(handlers.on_job(job_event("a", "1")))
    clock.settle(handlers.queue)
    run(handlers.on_job(job_event("a", "2", type_="DELETED")))
    assert len(handlers.queue) == 0  # its next unprompted pass is dropped too
    run(handlers.on_child(pod_event("a")))
    clock.advance(600)  # past the interval, the resync and the poke delay
    clock.settle(handlers.queue)
    assert len(reconciler.calls) == 1
    assert reconciler.forgotten == ["uid-a"]
    assert handlers.health()["jobs"] == 0


def test_an_active_job_is_passed_again_after_the_interval(clock: FakeClock) -> None:
    reconciler = RecordingReconciler()
    jobs = JobHandlers(reconciler, HandlerSettings(interval_seconds=5, resync_seconds=600), clock=clock)
    jobs.bind(pods={}, workers={})
    jobs.start()
    try:
        run(jobs.on_job(job_event("a", "1")))
        clock.settle(jobs.queue)
        for passes in (1, 2, 3):
            assert len(reconciler.calls) == passes
            clock.advance(4)
            clock.settle(jobs.queue)
            assert len(reconciler.calls) == passes, "passed again before the interval"
            clock.advance(1)
            clock.settle(jobs.queue)
        reconciler.state = State.SUCCEEDED  # at rest: the pass after next is the resync, far away
        clock.advance(5)
        clock.settle(jobs.queue)
        assert len(reconciler.calls) == 5
        clock.advance(599)
        clock.settle(jobs.queue)
        assert len(reconciler.calls) == 5
        clock.advance(1)
        clock.settle(jobs.queue)
        assert len(reconciler.calls) == 6
    finally:
        jobs.stop()


@pytest.mark.parametrize(
    ("state", "requeue_after", "expected"),
    [
        (State.RUNNING, None, 5.0),
        (State.PENDING, None, 5.0),
        (State.RUNNING, 2.0, 2.0),  # a deadline due sooner than the interval
        (State.SUCCEEDED, None, 300.0),
        (State.FAILED, 30.0, 30.0),  # a TTL due before the resync
        (State.SUSPENDED, None, 300.0),
        (State.SUCCEEDED, 0.0, 0.1),  # due now: still never a busy loop
    ],
)
def test_next_pass(state: State, requeue_after: float | None, expected: float) -> None:
    decision = Decision(status=FineTuneJobStatus(state=state), replicas=1, plan=None)
    outcome = Outcome(decision, False, False, requeue_after)
    assert next_pass(outcome, HandlerSettings(interval_seconds=5.0, resync_seconds=300.0)) == expected
