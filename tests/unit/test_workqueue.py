"""The keyed work queue: merging pokes, one pass per key at a time, requeue and backoff.

Time is a `FakeClock`: a delay, requeue or backoff elapses only when the test advances the
clock, and `settle` waits until the queue has run everything due by then. So "nothing more
happens" is checked at a known time (including long after), and "not before" exactly.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterator

import pytest

from finetune_operator.reconcile.workqueue import WorkQueue
from tests.support.clock import WAIT_LIMIT_S, FakeClock

LATER = 3600.0
"""Far beyond any delay, requeue or backoff in these tests: whatever is still wanted is due."""


class Recorder:
    """A pass that records its key, can be held open, and returns a scripted delay."""

    def __init__(self, again: float | None = None) -> None:
        self.calls: Counter[Hashable] = Counter()
        self.again = again
        self.gate = threading.Event()
        self.gate.set()
        self.inside = threading.Event()
        self.concurrent: Counter[Hashable] = Counter()
        self.max_concurrent: Counter[Hashable] = Counter()
        self.changed = threading.Condition()
        self.fail_times = 0

    def __call__(self, key: Hashable) -> float | None:
        with self.changed:
            self.concurrent[key] += 1
            self.max_concurrent[key] = max(self.max_concurrent[key], self.concurrent[key])
            self.calls[key] += 1
            fail = self.fail_times > 0
            self.fail_times -= 1 if fail else 0
            self.changed.notify_all()
        self.inside.set()
        self.gate.wait(WAIT_LIMIT_S)
        with self.changed:
            self.concurrent[key] -= 1
            self.changed.notify_all()
        if fail:
            raise RuntimeError("apiserver said 500")
        return self.again

    def wait_until(self, predicate: Callable[[], bool]) -> None:
        """For states inside passes (held open by the gate), which the clock does not see."""
        with self.changed:
            assert self.changed.wait_for(predicate, WAIT_LIMIT_S), "the passes never got there"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_queue(clock: FakeClock) -> Iterator[Callable[..., WorkQueue]]:
    queues: list[WorkQueue] = []

    def make(work: Callable[[Hashable], float | None], **kw: float) -> WorkQueue:
        queue = WorkQueue(work, workers=int(kw.pop("workers", 4)), clock=clock, **kw)
        queue.start()
        queues.append(queue)
        return queue

    yield make
    for queue in queues:
        queue.stop()


def test_a_poke_runs_the_key_once(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()
    queue = make_queue(work)
    queue.poke("a")
    clock.settle(queue)
    assert work.calls == Counter({"a": 1})
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls == Counter({"a": 1})


def test_a_key_that_wants_nothing_more_keeps_no_entry(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()  # returns None: no next pass wanted
    queue = make_queue(work)
    for i in range(50):  # e.g. pod events of jobs that were deleted
        queue.poke(("ns", f"gone-{i}"))
    clock.settle(queue)
    assert len(queue) == 0 and len(work.calls) == 50 and all(n == 1 for n in work.calls.values())
    queue.poke(("ns", "gone-0"))  # and a later poke still runs it
    clock.settle(queue)
    assert work.calls[("ns", "gone-0")] == 2


def test_pokes_while_waiting_merge_into_one_pass(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()
    queue = make_queue(work)
    for _ in range(50):
        queue.poke("a", delay=0.25)
    clock.advance(0.125)
    clock.settle(queue)
    assert work.calls["a"] == 0  # not before the delay
    clock.advance(0.125)
    clock.settle(queue)
    assert work.calls["a"] == 1
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls["a"] == 1


def test_pokes_while_running_give_exactly_one_more_pass(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()
    work.gate.clear()
    queue = make_queue(work)
    queue.poke("a")
    assert work.inside.wait(WAIT_LIMIT_S)
    for _ in range(20):
        queue.poke("a")
    clock.nudge()  # whatever those pokes made due has been handed out
    assert queue.running == 1 and work.calls["a"] == 1  # never a second pass beside the first
    work.gate.set()
    clock.settle(queue)
    assert work.calls["a"] == 2
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls["a"] == 2
    assert work.max_concurrent["a"] == 1


def test_the_pass_asks_when_to_run_again(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder(again=0.5)
    queue = make_queue(work)
    queue.poke("a")
    clock.settle(queue)
    for passes in (1, 2, 3):
        assert work.calls["a"] == passes
        clock.advance(0.25)
        clock.settle(queue)
        assert work.calls["a"] == passes, "ran before the time it asked for"
        clock.advance(0.25)
        clock.settle(queue)
    assert work.calls["a"] == 4
    work.again = None  # no more wanted passes: the key rests until poked
    clock.advance(0.5)
    clock.settle(queue)
    assert work.calls["a"] == 5  # the pass the fourth one asked for
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls["a"] == 5 and len(queue) == 0


def test_a_failing_pass_is_retried_with_growing_backoff(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()
    work.fail_times = 3
    queue = make_queue(work, backoff_base=1.0, backoff_max=3.0)
    queue.poke("a")
    clock.settle(queue)
    for passes, backoff in ((1, 1.0), (2, 2.0), (3, 3.0)):  # 1, 2, then 4 capped at 3
        assert work.calls["a"] == passes
        clock.advance(backoff - 0.5)
        clock.settle(queue)
        assert work.calls["a"] == passes, f"retried before its {backoff} s backoff"
        clock.advance(0.5)
        clock.settle(queue)
    assert work.calls["a"] == 4
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls["a"] == 4  # succeeded, nothing more wanted


def test_a_forgotten_key_is_not_run_again(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder(again=0.5)
    queue = make_queue(work)
    queue.poke("a")
    clock.settle(queue)
    assert work.calls["a"] == 1
    queue.forget("a")  # at rest, with a pass wanted in 0.5 s
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls["a"] == 1 and len(queue) == 0
    work.gate.clear()
    work.inside.clear()
    queue.poke("b")
    assert work.inside.wait(WAIT_LIMIT_S)
    queue.forget("b")  # during its pass: that pass finishes, and asks for another in vain
    work.gate.set()
    clock.advance(LATER)
    clock.settle(queue)
    assert work.calls["b"] == 1 and len(queue) == 0


def test_keys_run_in_parallel_but_each_one_alone(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()
    work.gate.clear()
    queue = make_queue(work, workers=4)
    for key in "abcd":
        queue.poke(key)
    work.wait_until(lambda: sum(work.concurrent.values()) == 4)
    assert queue.running == 4
    for _ in range(10):
        for key in "abcd":
            queue.poke(key)
    work.gate.set()
    clock.settle(queue)
    assert all(work.calls[k] == 2 for k in "abcd")
    assert all(work.max_concurrent[k] == 1 for k in "abcd")


def test_more_keys_than_workers_all_run(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    work = Recorder()
    queue = make_queue(work, workers=2)
    for i in range(100):
        queue.poke(i)
    clock.settle(queue)
    assert len(work.calls) == 100 and set(work.calls.values()) == {1}


def test_urgent_keys_go_before_every_other_due_key(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    """New jobs first: a burst of creations is not queued behind status passes."""
    order: list[Hashable] = []
    busy, gate = threading.Event(), threading.Event()

    def work(key: Hashable) -> None:
        if key == "busy":
            busy.set()
            gate.wait(WAIT_LIMIT_S)
        order.append(key)

    queue = make_queue(work, workers=1)
    queue.poke("busy")
    assert busy.wait(WAIT_LIMIT_S)
    for key in ("status-1", "status-2", "status-3"):
        queue.poke(key)
    queue.poke("new-1", urgent=True)
    queue.poke("status-2", urgent=True)  # an already waiting key can be promoted
    queue.poke("new-2", delay=0.5, urgent=True)  # urgent keys keep their due order among themselves
    clock.advance(0.5)
    gate.set()
    clock.settle(queue)
    assert order == ["busy", "new-1", "status-2", "new-2", "status-1", "status-3"]


def test_an_urgent_poke_during_a_pass_makes_the_next_pass_urgent(
    make_queue: Callable[..., WorkQueue], clock: FakeClock
) -> None:
    order: list[Hashable] = []
    inside, gate = threading.Event(), threading.Event()

    def work(key: Hashable) -> None:
        if key == "a" and not order:
            inside.set()
            gate.wait(WAIT_LIMIT_S)
        order.append(key)

    queue = make_queue(work, workers=1)
    queue.poke("a")
    assert inside.wait(WAIT_LIMIT_S)
    queue.poke("b")
    queue.poke("a", urgent=True)  # "a" is running: its next pass is remembered as urgent
    gate.set()
    clock.settle(queue)
    assert order == ["a", "a", "b"]
