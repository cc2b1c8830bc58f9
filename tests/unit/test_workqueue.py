"""The keyed work queue: merging pokes, one pass per key at a time, requeue and backoff."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator

import pytest

from finetune_operator.reconcile.workqueue import WorkQueue


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


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
        self.lock = threading.Lock()
        self.fail_times = 0

    def __call__(self, key: Hashable) -> float | None:
        with self.lock:
            self.concurrent[key] += 1
            self.max_concurrent[key] = max(self.max_concurrent[key], self.concurrent[key])
            self.calls[key] += 1
            fail = self.fail_times > 0
            self.fail_times -= 1 if fail else 0
        self.inside.set()
        self.gate.wait(5)
        with self.lock:
            self.concurrent[key] -= 1
        if fail:
            raise RuntimeError("apiserver said 500")
        return self.again


@pytest.fixture
def make_queue() -> Iterator[Callable[..., WorkQueue]]:
    queues: list[WorkQueue] = []

    def make(work: Callable[[Hashable], float | None], **kw: float) -> WorkQueue:
        queue = WorkQueue(work, workers=int(kw.pop("workers", 4)), **kw)
        queue.start()
        queues.append(queue)
        return queue

    yield make
    for queue in queues:
        queue.stop()


def test_a_poke_runs_the_key_once(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()
    queue = make_queue(work)
    queue.poke("a")
    wait_for(lambda: work.calls["a"] == 1)
    time.sleep(0.1)
    assert work.calls == Counter({"a": 1})


def test_a_key_that_wants_nothing_more_keeps_no_entry(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()  # returns None: no next pass wanted
    queue = make_queue(work)
    for i in range(50):  # e.g. pod events of jobs that were deleted
        queue.poke(("ns", f"gone-{i}"))
    wait_for(lambda: len(work.calls) == 50)
    wait_for(lambda: len(queue) == 0)
    assert len(queue) == 0 and all(n == 1 for n in work.calls.values())
    queue.poke(("ns", "gone-0"))  # and a later poke still runs it
    wait_for(lambda: work.calls[("ns", "gone-0")] == 2)
    assert work.calls[("ns", "gone-0")] == 2


def test_pokes_while_waiting_merge_into_one_pass(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()
    queue = make_queue(work)
    for _ in range(50):
        queue.poke("a", delay=0.2)
    wait_for(lambda: work.calls["a"] == 1)
    time.sleep(0.3)
    assert work.calls["a"] == 1


def test_pokes_while_running_give_exactly_one_more_pass(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()
    work.gate.clear()
    queue = make_queue(work)
    queue.poke("a")
    assert work.inside.wait(5)
    for _ in range(20):
        queue.poke("a")
    time.sleep(0.05)
    assert work.calls["a"] == 1  # never a second pass beside the first
    work.gate.set()
    wait_for(lambda: work.calls["a"] == 2)
    time.sleep(0.1)
    assert work.calls["a"] == 2
    assert work.max_concurrent["a"] == 1


def test_the_pass_asks_when_to_run_again(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder(again=0.05)
    queue = make_queue(work)
    queue.poke("a")
    wait_for(lambda: work.calls["a"] >= 4)
    work.again = None  # no more wanted passes: the key rests until poked
    time.sleep(0.2)
    settled = work.calls["a"]
    time.sleep(0.2)
    assert work.calls["a"] == settled


def test_a_failing_pass_is_retried_with_growing_backoff(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()
    work.fail_times = 3
    queue = make_queue(work, backoff_base=0.05, backoff_max=1.0)
    started = time.monotonic()
    queue.poke("a")
    wait_for(lambda: work.calls["a"] == 4)
    # 0.05 + 0.1 + 0.2 between the four passes
    assert time.monotonic() - started >= 0.35
    time.sleep(0.3)
    assert work.calls["a"] == 4  # succeeded, nothing more wanted


def test_a_forgotten_key_is_not_run_again(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder(again=0.05)
    queue = make_queue(work)
    queue.poke("a")
    wait_for(lambda: work.calls["a"] >= 1)
    queue.forget("a")
    time.sleep(0.15)
    settled = work.calls["a"]
    time.sleep(0.2)
    assert work.calls["a"] == settled
    assert len(queue) == 0


def test_keys_run_in_parallel_but_each_one_alone(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()
    work.gate.clear()
    queue = make_queue(work, workers=4)
    for key in "abcd":
        queue.poke(key)
    wait_for(lambda: sum(work.concurrent.values()) == 4)
    assert queue.running == 4
    for _ in range(10):
        for key in "abcd":
            queue.poke(key)
    work.gate.set()
    wait_for(lambda: all(work.calls[k] == 2 for k in "abcd"))
    assert all(work.max_concurrent[k] == 1 for k in "abcd")


def test_more_keys_than_workers_all_run(make_queue: Callable[..., WorkQueue]) -> None:
    work = Recorder()
    queue = make_queue(work, workers=2)
    for i in range(100):
        queue.poke(i)
    wait_for(lambda: len(work.calls) == 100)
    assert set(work.calls.values()) == {1}


def test_urgent_keys_go_before_every_other_due_key(make_queue: Callable[..., WorkQueue]) -> None:
    """New jobs first: a burst of creations is not queued behind status passes."""
    order: list[Hashable] = []
    gate = threading.Event()

    def work(key: Hashable) -> None:
        if key == "busy":
            gate.wait(5)
        order.append(key)

    queue = make_queue(work, workers=1)
    queue.poke("busy")
    wait_for(lambda: queue.running == 1)
    for key in ("status-1", "status-2", "status-3"):
        queue.poke(key)
    queue.poke("new-1", urgent=True)
    queue.poke("status-2", urgent=True)  # an already waiting key can be promoted
    queue.poke("new-2", delay=0.05, urgent=True)  # urgent keys keep their due order among themselves
    time.sleep(0.1)
    gate.set()
    wait_for(lambda: len(order) == 6)
    assert order == ["busy", "new-1", "status-2", "new-2", "status-1", "status-3"]


def test_an_urgent_poke_during_a_pass_makes_the_next_pass_urgent(make_queue: Callable[..., WorkQueue]) -> None:
    order: list[Hashable] = []
    gate = threading.Event()

    def work(key: Hashable) -> None:
        if key == "a" and not order:
            gate.wait(5)
        order.append(key)

    queue = make_queue(work, workers=1)
    queue.poke("a")
    wait_for(lambda: queue.running == 1)
    queue.poke("b")
    queue.poke("a", urgent=True)  # "a" is running: its next pass is remembered as urgent
    gate.set()
    wait_for(lambda: len(order) == 3)
    assert order == ["a", "a", "b"]
