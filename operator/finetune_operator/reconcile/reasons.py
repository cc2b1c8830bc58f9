"""Condition reasons, event reasons and failure classification, named in one place."""

from __future__ import annotations

import json
import re
from typing import Any

from .observed import Termination

PLANNED = "Planned"
INVALID_SPEC = "InvalidSpec"
DOES_NOT_FIT = "DoesNotFit"
WAITING = "WaitingForWorkers"
ALL_RUNNING = "AllRanksRunning"
COMPLETED = "Completed"
RANK_FAILED = "RankFailed"
OUT_OF_MEMORY = "OutOfMemory"
REPLANNED = "OutOfMemoryReplanned"
CONFIG_CHANGED = "ConfigChanged"
RECOVERED = "Recovered"
BACKOFF_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"
SUSPENDED = "Suspended"
RESUMED = "Resumed"
NOT_SUSPENDED = "NotSuspended"
NOT_RUNNING = "NotRunning"
GANG_RESTART = "GangRestart"
EXPIRED = "TTLExpired"

_OOM = re.compile(
    r"^OutOfMemory:|out of memory|OutOfMemoryError|OOMKilled|\bOOM\b|can(no|')t allocate memory|std::bad_alloc",
    re.IGNORECASE | re.MULTILINE,
)


def is_out_of_memory(term: Termination) -> bool:
    """OOM, per the trainer's root cause (`OutOfMemory: ...`) or the kubelet (`OOMKilled`).

    Exit 137 alone is a SIGKILL from anyone (the memory killer, an eviction, a person);
    when it was the memory killer the kubelet says OOMKilled.
    """
    return term.reason == "OOMKilled" or bool(_OOM.search(term.message))


NOT_RETRIED = ("ConfigError", "DataError")
"""The trainer's root causes that a restart cannot change: the job's own input is wrong
(an unreadable or impossible setting, a malformed record under `dataset.onMalformedLine: Fail`)."""


def _first_line(term: Termination) -> str:
    return next((line.strip() for line in term.message.splitlines() if line.strip()), "")


def not_retried(term: Termination) -> str | None:
    """The trainer's reason when the failure would repeat on every gang restart, else None."""
    first = _first_line(term)
    return next((reason for reason in NOT_RETRIED if first.startswith(reason + ":")), None)


def root_cause(term: Termination, pod: str) -> str:
    """One line: the trainer's own root cause, or what the kubelet saw."""
    first = _first_line(term)
    if first.startswith("{"):
        try:
            parsed = json.loads(term.message)
            first = str(parsed.get("error") or parsed.get("message") or first)
        except (ValueError, AttributeError):
            pass
    detail = f": {first[:900]}" if first else ""
    reason = f" ({term.reason})" if term.reason and term.reason not in ("Error", "Completed") else ""
    return f"{pod} exited with code {term.exit_code}{reason}{detail}"


def summary_of(term: Termination) -> dict[str, Any]:
    """The trainer's JSON summary from a successful rank's termination message."""
    try:
        parsed = json.loads(term.message)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
