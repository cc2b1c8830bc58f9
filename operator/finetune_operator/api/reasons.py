"""The words of a FineTuneJob's status: condition types, their reasons, the headline state.

Each is named here once. The operator writes them into conditions and Events, the planner's
errors carry the reason they map to, and `kubectl get ftj` shows the state. The trainer's
root causes (`pod_contract.TerminationReason`) also become reasons when a run fails for good.
"""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    PLANNED = "Planned"
    QUEUED = "Queued"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class State(StrEnum):
    """Headline of the conditions, for printer columns."""

    PENDING = "Pending"
    PLANNED = "Planned"
    QUEUED = "Queued"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


PLANNED = "Planned"
INVALID_SPEC = "InvalidSpec"
DOES_NOT_FIT = "DoesNotFit"
WAITING = "WaitingForWorkers"
ALL_RUNNING = "AllRanksRunning"
FINISHING = "RanksFinishing"
COMPLETED = "Completed"
RANK_FAILED = "RankFailed"
OUT_OF_MEMORY = "OutOfMemory"
REPLANNED = "OutOfMemoryReplanned"
RESUMED_CHECKPOINT = "ResumedFromCheckpoint"
CONFIG_CHANGED = "ConfigChanged"
RECOVERED = "Recovered"
BACKOFF_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"
SUSPENDED = "Suspended"
RESUMED = "Resumed"
GANG_RESTART = "GangRestart"
EXPIRED = "TTLExpired"
CHILD_CONFLICT = "ChildConflict"
CHILD_WRITE_FAILED = "ChildWriteFailed"
QUEUED = "Queued"
ADMITTED = "Admitted"
EVICTED = "Evicted"
WORKLOAD_CHANGED = "WorkloadChanged"
TRACKING_FAILING = "TrackingFailing"
TRACKING_RECOVERED = "TrackingRecovered"
TRACKING_INCOMPLETE = "TrackingIncomplete"
