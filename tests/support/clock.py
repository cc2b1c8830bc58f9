"""A clock for the work queue that moves only when the test moves it.

`FakeClock` implements the queue's `Clock`: `now()` stands still until `advance()`, and the
queue's scheduler, waiting for its next due key, wakes when `advance()` passes that time (or
when the queue is notified, as with real time). Each time the scheduler is about to block,
it has handed out every due key a worker is free for: `wait_until` checks a condition again
at those moments, so a test waits for "the queue has nothing left to do now" (`settle`)
instead of sleeping and hoping that a pass that should not happen would have happened by then.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from finetune_operator.reconcile.workqueue import WorkQueue

WAIT_LIMIT_S = 5.0
"""Real seconds a `wait_until` gives a condition before the test fails (only a broken queue waits)."""


class FakeClock:
    """A `Clock` moved by hand (see the module docstring); starts at 1000.0."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._moves = 0
        self._state = threading.Condition()
        self._seen: dict[int, int] = {}  # thread id → the move it last read `now` at
        self._blocked: set[threading.Condition] = set()
        self._parks = 0

    def now(self) -> float:
        with self._state:
            self._seen[threading.get_ident()] = self._moves
            return self._now

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        with self._state:
            if self._seen.get(threading.get_ident()) != self._moves or (timeout is not None and timeout <= 0):
                return  # time moved since the caller looked, or it asked not to block: let it look again
            self._blocked.add(condition)
            self._parks += 1
            self._state.notify_all()
        try:
            condition.wait()  # woken by the queue itself, or by `advance`
        finally:
            with self._state:
                self._blocked.discard(condition)

    def advance(self, seconds: float) -> None:
        """Move time on and wake whoever waits on this clock, so keys due by then run."""
        with self._state:
            self._now += seconds
            self._moves += 1
            blocked = list(self._blocked)
        for condition in blocked:
            with condition:
                condition.notify_all()

    def wait_until(self, predicate: Callable[[], bool], what: str = "the condition") -> None:
        """Return once `predicate()` holds, checking it now and after each time a waiter blocks on
        this clock; fail after WAIT_LIMIT_S real seconds."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        while True:
            parks = self._park_count()
            if predicate():
                return
            blocked_again = self._blocked_since(parks, deadline)
            assert blocked_again or predicate(), f"{what} not reached within {WAIT_LIMIT_S} s"

    def nudge(self) -> None:
        """Wake the waiters without moving time, and return once one has blocked again: the queue's
        scheduler has then handed out whatever the queue holds due right now."""
        parks = self._park_count()
        self.advance(0)
        assert self._blocked_since(parks, time.monotonic() + WAIT_LIMIT_S), "the scheduler never blocked again"

    def _park_count(self) -> int:
        with self._state:
            return self._parks

    def _blocked_since(self, parks: int, deadline: float) -> bool:
        with self._state:
            return self._state.wait_for(lambda: self._parks > parks, deadline - time.monotonic())

    def settle(self, queue: WorkQueue) -> None:
        """Wait until `queue` runs no pass and has none due at this clock's time."""
        self.wait_until(queue.idle, "an idle queue")
