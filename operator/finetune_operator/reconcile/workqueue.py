"""A keyed work queue in the manner of client-go's: one reconciliation per job at a time.

Events of a job and of its pods only *poke* the job's key. A poke while the key waits
is merged with it (a burst of pod events costs one reconciliation); a poke while it is
being reconciled marks it dirty, so it runs once more right after. Each pass returns
when it wants to run again (progress, deadlines, TTLs); a failed pass is retried with a
per-key exponential backoff. A pool of worker threads runs the passes, and one
scheduler thread hands out keys when they are due: no per-job timer task or thread.

A poke can be *urgent* (a job seen for the first time: its children do not exist yet).
Due urgent keys are handed out before any other due key, so a burst of new jobs is not
queued behind the status passes their predecessors' pods cause. Each key is urgent at
most once per poke, so the other keys wait only while new work keeps arriving.

The queue reads and waits on time through a `Clock` (real monotonic time unless given
another), so a test can move time by hand and see every due pass run, and none early.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("finetune_operator.workqueue")

Work = Callable[[Hashable], float | None]
"""One pass for a key; returns the seconds until the next wanted pass (None: only on a poke)."""


class Clock(Protocol):
    """Time as the queue reads it and waits on it."""

    def now(self) -> float:
        """Seconds on a clock that never goes back."""

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        """Wait on `condition` (held by the caller) until it is notified or `timeout` seconds of
        this clock have passed since the caller last read `now` (None: no limit)."""


class MonotonicClock:
    """Real time: `time.monotonic`, and the condition's own timed wait."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        condition.wait(timeout)


@dataclass
class _Entry:
    due: float | None = None  # when the next pass is wanted (while running: after this one)
    running: bool = False
    failures: int = 0
    urgent: bool = False  # the next pass goes before every other due key


class WorkQueue:
    def __init__(
        self,
        work: Work,
        *,
        workers: int = 8,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        clock: Clock | None = None,
    ) -> None:
        self._work = work
        self._workers = workers
        self._backoff = (backoff_base, backoff_max)
        self._clock = clock or MonotonicClock()
        self._entries: dict[Hashable, _Entry] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._urgent: list[tuple[float, int, Hashable]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._stopping = False
        self._pool: ThreadPoolExecutor | None = None
        self._scheduler: threading.Thread | None = None
        self._context: contextvars.Context | None = None
        self.running = 0

    def use_context(self, context: contextvars.Context) -> None:
        """Run every pass in a copy of `context` (a framework's context variables, e.g. kopf's
        event queue, which its posting functions need and worker threads do not inherit)."""
        self._context = context

    # ---- producers (any thread, including the event loop: never blocks for long) ----------------
    def poke(self, key: Hashable, delay: float = 0.0, urgent: bool = False) -> None:
        """Run `key` within `delay` seconds (sooner if already due sooner); an `urgent` key
        goes before every other due key."""
        with self._cond:
            entry = self._entries.setdefault(key, _Entry())
            due = self._clock.now() + delay
            if entry.running:  # remembered; scheduled when the pass in flight ends
                entry.due = due if entry.due is None else min(entry.due, due)
                entry.urgent = entry.urgent or urgent
                return
            if urgent and not entry.urgent:
                entry.urgent, entry.due = True, None  # re-filed in the urgent lane
            self._schedule(entry, key, due)

    def forget(self, key: Hashable) -> None:
        """Drop the key (its object is gone); a pass in flight finishes but is not rescheduled."""
        with self._cond:
            self._entries.pop(key, None)

    def depth(self) -> int:
        """How many keys are due and waiting for a worker."""
        with self._cond:
            return self._due(self._clock.now())

    def idle(self) -> bool:
        """No pass runs and none is due: nothing happens before a poke or the next due time."""
        with self._cond:
            return self.running == 0 and self._due(self._clock.now()) == 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    # ---- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="reconcile")
        self._scheduler = threading.Thread(target=self._schedule_loop, name="workqueue", daemon=True)
        self._scheduler.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._scheduler is not None:
            self._scheduler.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    # ---- internals ------------------------------------------------------------------------------
    def _due(self, now: float) -> int:
        return sum(1 for e in self._entries.values() if e.due is not None and e.due <= now and not e.running)

    def _schedule(self, entry: _Entry, key: Hashable, due: float) -> None:
        if entry.due is not None and entry.due <= due:
            return
        entry.due = due
        heapq.heappush(self._urgent if entry.urgent else self._heap, (due, next(self._order), key))
        self._cond.notify()

    def _next_due(self, now: float) -> Hashable | None:
        """The key to run now: the earliest due urgent one, else the earliest due one."""
        for heap, urgent in ((self._urgent, True), (self._heap, False)):
            while heap and heap[0][0] <= now:
                due, _, key = heapq.heappop(heap)
                entry = self._entries.get(key)
                if entry is None or entry.running or entry.due != due or entry.urgent != urgent:
                    continue  # forgotten, in flight, superseded by an earlier poke, or re-filed
                entry.due, entry.running, entry.urgent = None, True, False
                return key
        return None

    def _schedule_loop(self) -> None:
        with self._cond:
            while not self._stopping:
                now = self._clock.now()
                while self.running < self._workers:
                    key = self._next_due(now)
                    if key is None:
                        break
                    self.running += 1
                    assert self._pool is not None
                    self._pool.submit(self._run, key)
                tops = [heap[0][0] for heap in (self._urgent, self._heap) if heap]
                if tops and self.running < self._workers:
                    self._clock.wait(self._cond, max(0.0, min(tops) - now))
                else:
                    self._clock.wait(self._cond, None)

    def _run(self, key: Hashable) -> None:
        try:
            context = self._context
            again: float | None = context.copy().run(self._work, key) if context else self._work(key)
            failed = False
        except Exception:
            log.exception("reconciling %s failed; retrying with backoff", key)
            again, failed = None, True
        with self._cond:
            self.running -= 1
            self._cond.notify()
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.running = False
            now = self._clock.now()
            if failed:
                entry.failures += 1
                base, most = self._backoff
                again = min(most, base * 2 ** (entry.failures - 1))
            else:
                entry.failures = 0
            wanted = [t for t in (entry.due, None if again is None else now + again) if t is not None]
            entry.due = None
            if wanted:
                self._schedule(entry, key, min(wanted))
            else:
                del self._entries[key]  # nothing wanted: a key at rest (or of a deleted job) keeps no memory
