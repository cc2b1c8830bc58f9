"""From watch events to reconciliations: the job book, the work queue and when to pass again.

Nothing here imports kopf: the kopf handlers in `registry` hand their keyword arguments
over, and tests drive these methods directly with a recording reconciler.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from ..api.reasons import State
from ..reconcile.observed import Observed, owned
from ..reconcile.runner import Outcome
from ..reconcile.workqueue import Clock, WorkQueue
from ..render.identity import JOB_NAME_LABEL

POKE_DELAY_SECONDS = 0.05
"""Pod and StatefulSet events of one job arriving together are merged into one pass."""

Key = tuple[str, str]


@dataclass(frozen=True)
class HandlerSettings:
    interval_seconds: float = 5.0
    """Pass interval of an active job (progress, deadlines); events trigger passes at once."""
    resync_seconds: float = 300.0
    """Pass interval of a finished or suspended job (a safety net: events wake it)."""
    max_workers: int = 16
    kueue: bool = False
    """Watch Kueue Workloads (Kueue installed): queued jobs start when admitted."""


class ReconcilerLike(Protocol):
    def reconcile(self, body: Mapping[str, Any], observed: Observed, apply_all: bool = False) -> Outcome: ...

    def forget(self, uid: str) -> None: ...

    def is_own_write(self, uid: str, resource_version: str) -> bool: ...


def job_key(kw: Mapping[str, Any]) -> Key:
    """The owning job of a child, from its namespace and job-name label."""
    return (str(kw["namespace"]), str(kw["labels"][JOB_NAME_LABEL]))


def _slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The job as the reconciler needs it, without managedFields (often most of its size)."""
    raw = dict(body)
    meta = dict(raw.get("metadata") or {})
    meta.pop("managedFields", None)
    raw["metadata"] = meta
    return raw


def next_pass(outcome: Outcome, settings: HandlerSettings) -> float:
    """Seconds until a job's next unprompted pass: soon while active, rarely once at rest,
    and never later than a deadline or TTL the decision asked for."""
    decision = outcome.decision
    at_rest = decision is not None and decision.status.state in (State.SUCCEEDED, State.FAILED, State.SUSPENDED)
    wait = settings.resync_seconds if at_rest else settings.interval_seconds
    if outcome.requeue_after is not None:
        wait = min(wait, outcome.requeue_after)
    return max(0.1, wait)


class JobHandlers:
    """The newest body of every job, the live child indexes, and the queue that reconciles them."""

    def __init__(self, reconciler: ReconcilerLike, settings: HandlerSettings, clock: Clock | None = None) -> None:
        """`clock`: the work queue's (real monotonic time by default)."""
        self.reconciler = reconciler
        self.settings = settings
        self.queue = WorkQueue(self._pass, workers=settings.max_workers, clock=clock)
        self._lock = threading.Lock()
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._unapplied: set[Key] = set()
        self._pods: Mapping[Any, Any] = {}
        self._workers: Mapping[Any, Any] = {}
        self._workloads: Mapping[Any, Any] = {}
        self.bound = False

    def bind(
        self,
        pods: Mapping[Any, Any],
        workers: Mapping[Any, Any],
        context: contextvars.Context | None = None,
        workloads: Mapping[Any, Any] | None = None,
    ) -> None:
        """The child indexes (kopf.Index objects: live, updated in place) and the context to post Events in."""
        self._pods, self._workers = pods, workers
        self._workloads = workloads if workloads is not None else {}
        if context is not None:
            self.queue.use_context(context)
        self.bound = True

    def start(self) -> None:
        self.queue.start()

    def stop(self) -> None:
        self.queue.stop()

    # ---- events -----------------------------------------------------------------------------------
    async def on_job(self, kw: Mapping[str, Any]) -> None:
        key = (str(kw["namespace"]), str(kw["name"]))
        if (kw.get("type") or "") == "DELETED":
            with self._lock:
                self._bodies.pop(key, None)
                self._unapplied.discard(key)
            self.queue.forget(key)
            self.reconciler.forget(str(kw["uid"]))
            return
        body = kw["body"]
        with self._lock:
            first = key not in self._bodies
            if first:
                self._unapplied.add(key)  # first sight since start: re-assert every child once
            self._bodies[key] = _slim(body)
        version = str((body.get("metadata") or {}).get("resourceVersion", ""))
        if first:
            self.queue.poke(key, urgent=True)  # children to create: before passes that only update status
        elif not self.reconciler.is_own_write(str(kw["uid"]), version):
            self.queue.poke(key)  # the echo of our own status write needs no pass

    async def on_child(self, kw: Mapping[str, Any]) -> None:
        self.queue.poke(job_key(kw), delay=POKE_DELAY_SECONDS)

    def health(self) -> dict[str, int]:
        return {"jobs": len(self._bodies), "due": self.queue.depth(), "running": self.queue.running}

    # ---- one pass ---------------------------------------------------------------------------------
    def _pass(self, key: Hashable) -> float | None:
        job = cast(Key, key)
        with self._lock:
            body = self._bodies.get(job)
            first = job in self._unapplied
        if body is None:
            return None
        job_uid = str((body.get("metadata") or {}).get("uid") or "")
        observed = owned(
            job[1], job_uid, self._workers.get(job, []), self._pods.get(job, []), self._workloads.get(job, [])
        )
        outcome = self.reconciler.reconcile(body, observed, apply_all=first)
        if first:
            with self._lock:
                self._unapplied.discard(job)
        return next_pass(outcome, self.settings)
