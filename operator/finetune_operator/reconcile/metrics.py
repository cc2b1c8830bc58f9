"""The operator's own Prometheus metrics (`finetune_operator_` prefix).

Names mirror controller-runtime's so existing dashboards and alerts carry over.
Every label combination known at start-up is initialised to 0 so series never
appear late.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

from ..api import reasons as R
from ..api.reasons import State

CONTROLLER = "finetunejob"
RESULTS = ("success", "error", "requeue", "requeue_after")
VERSION = "0.1.0"

RECONCILE_TOTAL = Counter("finetune_operator_reconcile_total", "Reconciliations by result.", ["controller", "result"])
RECONCILE_ERRORS = Counter(
    "finetune_operator_reconcile_errors_total", "Reconciliations that raised an error.", ["controller"]
)
RECONCILE_TIME = Histogram(
    "finetune_operator_reconcile_time_seconds",
    "Wall time of one reconciliation.",
    ["controller"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ACTIVE_WORKERS = Gauge("finetune_operator_active_workers", "Reconciliations running right now.", ["controller"])
JOBS = Gauge("finetune_operator_jobs", "FineTuneJobs by namespace and headline condition.", ["namespace", "condition"])
RESTARTS = Counter("finetune_operator_job_restarts_total", "Gang restarts performed.", ["namespace"])
REPLANS = Counter("finetune_operator_replans_total", "Re-plans after a failure, by reason.", ["reason"])
BUILD_INFO = Gauge("finetune_operator_build_info", "Operator build; value 1.", ["version"])


def initialise(namespaces: tuple[str, ...] = ()) -> None:
    for result in RESULTS:
        RECONCILE_TOTAL.labels(CONTROLLER, result)
    RECONCILE_ERRORS.labels(CONTROLLER)
    RECONCILE_TIME.labels(CONTROLLER)
    ACTIVE_WORKERS.labels(CONTROLLER).set(0)
    REPLANS.labels(R.OUT_OF_MEMORY)
    BUILD_INFO.labels(VERSION).set(1)
    for namespace in namespaces:
        RESTARTS.labels(namespace)
        for state in State:
            JOBS.labels(namespace, state.value).set(0)


class JobCensus:
    """Headline state of every known job, exported as the `finetune_operator_jobs` gauge.

    Updated incrementally: a pass that leaves a job's state alone costs a dict lookup.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, tuple[str, str]] = {}
        self._counts: Tally[tuple[str, str]] = Tally()

    def record(self, uid: str, namespace: str, state: str | None) -> None:
        with self._lock:
            old = self._jobs.get(uid)
            new = None if state is None else (namespace, state)
            if old == new:
                return
            if old is not None:
                self._counts[old] -= 1
                JOBS.labels(*old).set(self._counts[old])
            if new is None:
                self._jobs.pop(uid, None)
                return
            self._jobs[uid] = new
            if new[0] not in {ns for ns, _ in self._counts}:
                for known in State:  # a namespace seen first: all its states exist from now on
                    JOBS.labels(new[0], known.value).set(0)
            self._counts[new] += 1
            JOBS.labels(*new).set(self._counts[new])
