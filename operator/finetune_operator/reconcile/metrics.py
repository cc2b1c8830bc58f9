"""The operator's own Prometheus metrics (`finetune_operator_` prefix).

Names mirror controller-runtime's so existing dashboards and alerts carry over.
Every label combination known at start-up is initialised to 0 so series never
appear late. Two per-job series (labelled like the trainers' `finetune_job` target label) feed
the chart's alerts: the gang restarts of each job and the time it entered its headline state
(a restart loop, a job queued too long); they exist while the operator knows the job.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

from ..api import reasons as R
from ..api.reasons import State
from ..api.status import FineTuneJobStatus
from ..api.timestamps import parse_timestamp

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
JOB_RESTARTS = Gauge(
    "finetune_operator_job_gang_restarts",
    "Gang restarts of this job so far (status.restarts); an alert counts its changes.",
    ["namespace", "finetune_job"],
)
JOB_STATE_SINCE = Gauge(
    "finetune_operator_job_state_since_timestamp_seconds",
    "Unix time this job entered its headline state (the lastTransitionTime of that condition; "
    "the creation for Pending); one series per job, labelled with the state.",
    ["namespace", "finetune_job", "state"],
)
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


def _unix(stamp: str | None) -> float | None:
    at = parse_timestamp(stamp)
    return None if at is None else at.timestamp()


def state_since(status: FineTuneJobStatus, created: str | None) -> float | None:
    """When the job entered its headline state: the lastTransitionTime of the true condition the
    state is read off (`conditions.headline`), the job's creation for Pending (no condition)."""
    state = str(status.state or State.PENDING)
    for condition in status.conditions:
        if condition.type == state and condition.status == "True":
            return _unix(condition.last_transition_time)
    return _unix(created) if state == State.PENDING else None


class JobCensus:
    """Headline state of every known job, exported as the `finetune_operator_jobs` gauge, and, for
    a job recorded with its name, its gang restarts and the time it entered that state.

    Updated incrementally: a pass that leaves a job's state alone costs a dict lookup.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, tuple[str, str]] = {}
        self._counts: Tally[tuple[str, str]] = Tally()
        self._series: dict[str, tuple[str, str, str, int, float | None]] = {}

    def record(
        self,
        uid: str,
        namespace: str,
        state: str | None,
        *,
        name: str = "",
        restarts: int = 0,
        since: float | None = None,
    ) -> None:
        self._record_series(uid, None if state is None or not name else (namespace, name, state, restarts, since))
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

    def _record_series(self, uid: str, new: tuple[str, str, str, int, float | None] | None) -> None:
        with self._lock:
            old = self._series.get(uid)
            if old == new:
                return
            if old is not None:
                if new is None or old[:3] != new[:3] or new[4] is None:
                    _drop(JOB_STATE_SINCE, *old[:3])
                if new is None or old[:2] != new[:2]:
                    _drop(JOB_RESTARTS, *old[:2])
            if new is None:
                self._series.pop(uid, None)
                return
            self._series[uid] = new
            namespace, name, state, restarts, since = new
            JOB_RESTARTS.labels(namespace, name).set(restarts)
            if since is not None:
                JOB_STATE_SINCE.labels(namespace, name, state).set(since)


def _drop(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set (a state with no known start)
        gauge.remove(*labels)
