"""What a finished trainer container says: out of memory, a root cause not worth retrying, its summary.

The kubelet reports the container's exit code, reason and termination message; the trainer
writes the message (`pod_contract`). These read it for the failure and success policies.
"""

from __future__ import annotations

import json

from ..api.pod_contract import TerminationReason, TrainingSummary, is_out_of_memory_text, reason_of_line
from .observed import Termination


def is_out_of_memory(term: Termination) -> bool:
    """OOM, per the trainer's root cause (`OutOfMemory: ...`) or the kubelet (`OOMKilled`).

    Exit 137 alone is a SIGKILL from anyone (the memory killer, an eviction, a person);
    when it was the memory killer the kubelet says OOMKilled.
    """
    return term.reason == "OOMKilled" or is_out_of_memory_text(term.message)


def _first_line(term: Termination) -> str:
    return next((line.strip() for line in term.message.splitlines() if line.strip()), "")


def is_preempted(term: Termination) -> bool:
    """The ranks stopped on SIGTERM after saving a checkpoint (`Preempted: ...`): not a failure."""
    return reason_of_line(_first_line(term)) == TerminationReason.PREEMPTED


def not_retried(term: Termination) -> TerminationReason | None:
    """The trainer's reason when the failure would repeat on every gang restart, else None."""
    reason = reason_of_line(_first_line(term))
    return reason if reason is not None and not reason.retried else None


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


def summary_of(term: Termination) -> TrainingSummary | None:
    """The trainer's summary from a successful rank's termination message, if it is one."""
    return TrainingSummary.from_message(term.message)
