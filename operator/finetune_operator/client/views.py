"""Pure pieces of the client and the day-two verbs: no cluster, no clock, no terminal.

The progress line of `wait`/`submit --wait`, durations (`--timeout 2h`), which pod holds a
rank, what the apiserver said about a refused object (one line per field), and the states
`wait` accepts. Kept apart so unit tests exercise them without a cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ..api import FineTuneJob
from ..api.reasons import State

JOB_NAME_LABEL = "finetune.dev/job-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
TRAINER_CONTAINER = "trainer"
FINAL_STATES = (State.SUCCEEDED.value, State.FAILED.value)
WAITABLE_STATES = (State.SUCCEEDED.value, State.FAILED.value, State.RUNNING.value, State.SUSPENDED.value)

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """Seconds in `2h`, `90m`, `1h30m`, `45s` or `45`; ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r} (e.g. 2h, 30m, 1h30m, 90s)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def format_duration(seconds: float | None) -> str:
    """`1h02m`, `3m05s`, `42s`; `?` when unknown."""
    if seconds is None or seconds < 0:
        return "?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def parse_states(values: Iterable[str]) -> tuple[str, ...]:
    """The states of `wait --for` (case-insensitive, comma-separated allowed), canonically spelled."""
    known = {s.lower(): s for s in WAITABLE_STATES}
    out: list[str] = []
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(","))):
            if part.lower() not in known:
                raise ValueError(f"unknown state {part!r}: one of {', '.join(WAITABLE_STATES)}")
            out.append(known[part.lower()])
    if not out:
        raise ValueError(f"no state given: one of {', '.join(WAITABLE_STATES)}")
    return tuple(dict.fromkeys(out))


def state_of(job: FineTuneJob) -> str:
    return str(job.status.state) if job.status and job.status.state else State.PENDING.value


def progress_line(job: FineTuneJob) -> str:
    """One line of where a job is: `tiny-cpu Running step 12/40 (30%) loss 1.2345 812 tok/s ETA 1m05s`."""
    parts = [job.name, state_of(job)]
    status = job.status
    progress = status.progress if status else None
    if progress is not None:
        total = f"/{progress.total_steps}" if progress.total_steps else ""
        percent = f" ({progress.percent}%)" if progress.percent is not None else ""
        parts.append(f"step {progress.step}{total}{percent}")
        if progress.loss is not None:
            parts.append(f"loss {progress.loss:.4f}")
        if progress.tokens_per_second is not None:
            parts.append(f"{progress.tokens_per_second:,.0f} tok/s")
        if progress.eta_seconds is not None and state_of(job) not in FINAL_STATES:
            parts.append(f"ETA {format_duration(progress.eta_seconds)}")
    if status is not None and status.restarts:
        parts.append(f"restarts {status.restarts}")
    return " ".join(parts)


def ranks_per_pod(job: FineTuneJob) -> int:
    return job.spec.resources.ranks_per_node


def pod_index_of_rank(job: FineTuneJob, rank: int) -> int:
    """The StatefulSet ordinal (node rank) of the pod that runs global rank `rank`."""
    world = job.spec.resources.world_size
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in the job's world of {world} rank(s) (0..{world - 1})")
    return rank // ranks_per_pod(job)


def rank_pod(pods: Iterable[dict[str, Any]], index: int) -> dict[str, Any] | None:
    """The live pod (not being deleted) with pod-index `index` among a job's pods, else None."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        ordinal = labels.get(POD_INDEX_LABEL)
        if ordinal is None:  # before Kubernetes 1.28: the ordinal is the name's suffix
            ordinal = str(meta.get("name", "")).rpartition("-")[2]
        if ordinal == str(index):
            return pod
    return None


def container_started(pod: dict[str, Any], container: str = TRAINER_CONTAINER) -> bool:
    """Whether the container has run at all (running now, or terminated): its log can be read."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            last = status.get("lastState") or {}
            return bool(state.get("running") or state.get("terminated") or last.get("terminated"))
    return False


def apiserver_problems(body: str | bytes | None) -> list[str]:
    """The field messages of an apiserver Status (422 Invalid), one line per cause:
    `spec.training.maxSteps: Invalid value: ...`. Falls back to its message."""
    try:
        status = json.loads(body or "{}")
    except ValueError:
        return [str(body)[:500]] if body else []
    if not isinstance(status, dict):
        return []
    causes = (status.get("details") or {}).get("causes") or []
    lines = []
    for cause in causes:
        field, message = cause.get("field"), cause.get("message", "")
        lines.append(f"{field}: {message}" if field else str(message))
    if not lines and status.get("message"):
        lines.append(str(status["message"]))
    return lines


def memory_from_metrics(text: str) -> dict[str, float]:
    """Rank 0's measured bytes by component from its Prometheus text: the model state
    (`finetune_model_state_bytes`, summed over devices and trainable) and `resident`
    (`process_resident_memory_bytes`), what there is on CPU; `gpu_peak` on GPU."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "finetune_model_state_bytes" and sample.labels.get("rank", "0") == "0":
                component = sample.labels.get("component", "")
                out[component] = out.get(component, 0.0) + sample.value
            elif sample.name == "process_resident_memory_bytes":
                out["resident"] = sample.value
            elif sample.name == "finetune_gpu_memory_allocated_peak_bytes" and sample.labels.get("rank", "0") == "0":
                out["gpu_peak"] = sample.value
    return out
