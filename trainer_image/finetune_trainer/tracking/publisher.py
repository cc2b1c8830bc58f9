"""One thread per sink that sends the journal's records to it, in order, until the job ends.

It runs in the pod's entrypoint, not in a training rank, so neither a slow server nor the
client's own work can take time from a step. Each round reads the next batch of whole steps
past what the sink has published (`journal.JournalReader`) and sends it; a failure (server
down, slow, refusing) is retried with back-off, after asking the sink again what it holds.
A sink failing for FAILING_AFTER_S is reported as failing in the status file, which rank 0's
metrics show the operator (a Warning Event); the records wait in the journal meanwhile, and
flow again, oldest first, once the sink answers.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Protocol

from finetune_trainer.tracking.journal import JournalReader, Record
from finetune_trainer.tracking.mlflow_sink import reason_of
from finetune_trainer.tracking.status import StatusBoard

log = logging.getLogger(__name__)

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 10.0)
FAILING_AFTER_S = 10.0
POLL_S = 1.0
BATCH_METRICS = 2000
PENDING_EVERY_S = 5.0
"""How often the count of waiting records is refreshed while a backlog is being sent."""


class Sink(Protocol):
    name: str

    def connect(self) -> int: ...

    def publish(self, records: list[Record]) -> None: ...

    def finish(self, artifacts: list[tuple[Path, str]], pointers: dict[str, str], failed: bool) -> None: ...

    def mark_failed(self) -> None: ...


class Publisher:
    def __init__(self, sink: Sink, journal: Path, board: StatusBoard) -> None:
        self.sink = sink
        self.reader = JournalReader(journal)
        self.board = board
        self.published: int | None = None
        """The sink's published step once connected (None: ask it again before sending)."""
        self.failing_since: float | None = None
        self.reason = ""
        self._pending = (0, -PENDING_EVERY_S)
        self.caught_up = threading.Event()
        self._draining = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tracking-{sink.name}", daemon=True)
        board.update_sink(sink.name, force=True)  # listed (healthy, nothing published) before its first answer

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self.published is None:
                    self.published = self.sink.connect()
                batch, end = self.reader.next_batch(self.published, BATCH_METRICS)
                if batch:
                    self.sink.publish(batch)
                    self.published = batch[-1].step
                self.reader.offset = end
            except Exception as exc:  # tracking never stops training: every failure is retried
                self.published = None
                self._failed(exc)
                self._stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1
                continue
            failures = 0
            self._healthy(idle=not batch)
            if not batch:
                if self._draining:
                    self.caught_up.set()
                self._wake.wait(POLL_S)
                self._wake.clear()

    def _failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        reason = reason_of(exc)
        if self.failing_since is None:
            self.failing_since = now
            log.warning("tracking: %s: %s (retrying; training goes on)", self.sink.name, str(exc)[:300])
        failing = now - self.failing_since >= FAILING_AFTER_S
        pending = self.pending()
        if failing and reason != self.reason:
            log.warning("tracking: %s failing for %.0f s (%s); %d records wait", self.sink.name,
                        now - self.failing_since, reason, pending)  # fmt: skip
        self.reason = reason
        self.board.update_sink(self.sink.name, failing=failing, reason=reason if failing else "", pending=pending)

    def _healthy(self, idle: bool) -> None:
        if self.failing_since is not None:
            log.warning("tracking: %s answers again", self.sink.name)
        self.failing_since, self.reason = None, ""
        pending = 0 if idle else self.pending(cached=True)
        self.board.update_sink(
            self.sink.name, force=idle, failing=False, reason="", pending=pending, published_step=self.published
        )

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def start_draining(self) -> None:
        """The journal is complete: say so once everything in it is published (`caught_up`)."""
        self._draining = True
        self._wake.set()

    def drain(self, deadline: float) -> bool:
        """Wait until everything in the journal is published (True) or `deadline` (monotonic) passes."""
        self.start_draining()
        return self.caught_up.wait(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread; False when it is stuck in a call (the sink is then left alone)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def pending(self, cached: bool = False) -> int:
        """Records waiting in the journal (with `cached`, the count of up to PENDING_EVERY_S ago)."""
        count, at = self._pending
        if not cached or time.monotonic() - at >= PENDING_EVERY_S:
            count = self.reader.pending()
            self._pending = (count, time.monotonic())
        return count
