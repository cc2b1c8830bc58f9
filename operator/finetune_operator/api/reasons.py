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
    SERVING = "Serving"


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
PREEMPTED = "Preempted"
"""The ranks stopped on SIGTERM (an eviction, a node drain, a spot reclaim) after saving a checkpoint."""
WORKLOAD_CHANGED = "WorkloadChanged"
SERVING_APPLIED = "ServingApplied"
SERVING_REFUSED = "ServingRefused"
SERVING_NOT_APPLIED = "ServingNotApplied"
TRACKING_FAILING = "TrackingFailing"
TRACKING_RECOVERED = "TrackingRecovered"
TRACKING_INCOMPLETE = "TrackingIncomplete"

# Reading the model's config.json (`reconcile/model_sources.py`, the inspector pod's verdict in
# `api/model_inspection.py`): Planned=False while it is read, Failed when it cannot be.
INSPECTING_MODEL = "InspectingModel"
"""An inspector pod reads the model (a claim, or a hub id with the job's token); the job waits."""
MODEL_NOT_FOUND = "ModelNotFound"
"""No such repo, revision, claim folder or config.json; or no safetensors weights."""
MODEL_GATED = "ModelGated"
"""A gated (or private) hub model and no token: the fix names spec.hfTokenSecretRef."""
MODEL_ACCESS_DENIED = "ModelAccessDenied"
"""The hub refused the job's token, or its account has no access to the gated model."""
HUB_UNREACHABLE = "HubUnreachable"
"""The endpoint did not answer (connection, timeout, 5xx): retried with backoff, the job waits."""
NOT_CAUSAL_LM = "NotCausalLM"
"""The config describes no causal language model (e.g. an encoder)."""
UNKNOWN_MODEL_TYPE = "UnknownModelType"
"""The model_type is unknown to the trainer image's transformers."""
INSPECTION_FAILED = "ModelInspectionFailed"
"""The inspector pod failed without a verdict (it crashed, or its answer could not be read)."""
