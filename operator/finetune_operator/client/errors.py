"""What can go wrong when a program drives FineTuneJobs, as exceptions that carry their meaning.

A notebook catches `JobRejected` to print the field messages (the lines `ftjob validate`
prints), `WaitTimeout` to decide whether to keep waiting, `JobFailed` to read the last
failure; the CLI maps each to its exit code (`exit_code`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..api import FineTuneJob


class FineTuneClientError(Exception):
    """Base of the client's errors; `exit_code` is what `ftjob` exits with for it."""

    exit_code = 1


class JobNotFound(FineTuneClientError):
    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(f"finetunejob {namespace}/{name} not found")
        self.name, self.namespace = name, namespace


class JobExists(FineTuneClientError):
    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(f"finetunejob {namespace}/{name} already exists (delete it or choose another name)")
        self.name, self.namespace = name, namespace


class JobRejected(FineTuneClientError):
    """A spec refused, locally or by the apiserver; `problems` are one line per field
    (`spec.training.maxSteps: ...`), as `ftjob validate` prints them."""

    exit_code = 2

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where, self.problems = where, list(problems)
        lines = [line if line.startswith(where) else f"{where}: {line}" for line in self.problems]
        super().__init__("\n".join(lines) or f"{where}: refused")


class WaitTimeout(FineTuneClientError, TimeoutError):
    """`wait` ran out of time; `job` is the last state seen (None if the job was never seen)."""

    exit_code = 124  # what timeout(1) exits with

    def __init__(self, name: str, until: tuple[str, ...], timeout: float, job: FineTuneJob | None) -> None:
        self.name, self.until, self.timeout, self.job = name, until, timeout, job
        state = (job.status.state if job and job.status else None) or "not started"
        progress = job.status.progress if job and job.status else None
        step = f", {progress.summary or f'step {progress.step}'}" if progress else ""
        super().__init__(
            f"timed out after {_seconds(timeout)} waiting for {name} to be {' or '.join(until)}: it is {state}{step}"
        )


class JobFailed(FineTuneClientError):
    """The job reached Failed while the caller waited for another state."""

    def __init__(self, job: FineTuneJob) -> None:
        self.job = job
        failure = job.status.last_failure if job.status else None
        why = f": {failure.reason}: {failure.message}".rstrip(": ") if failure else ""
        failed = next((c for c in (job.status.conditions if job.status else []) if c.type == "Failed"), None)
        if not why and failed is not None:
            why = f": {failed.reason}: {failed.message}".rstrip(": ")
        super().__init__(f"{job.name} failed{why}")


class ServingRefused(FineTuneClientError):
    """The serving target cannot serve the job's result: the `Serving` condition's message names
    the field and what would work."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name} cannot be served: {message}")
        self.name, self.message = name, message


class StateUnreachable(FineTuneClientError):
    """The job finished (Succeeded) without reaching the state waited for (e.g. Suspended)."""

    def __init__(self, job: FineTuneJob, until: tuple[str, ...]) -> None:
        self.job, self.until = job, until
        state = job.status.state if job.status else None
        super().__init__(f"{job.name} is {state}: it will never be {' or '.join(until)}")


class MetricsUnavailable(FineTuneClientError):
    """Rank 0's /metrics could not be read (no pod yet, no answer); the message says why."""


class ApiError(FineTuneClientError):
    """Any other answer of the apiserver (forbidden, unavailable, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status, self.reason = status, reason
        super().__init__(f"apiserver: {status} {reason}: {message}".rstrip(": "))


def _seconds(value: float) -> str:
    whole = int(value)
    if whole >= 3600 and whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole >= 60 and whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{value:g}s"
