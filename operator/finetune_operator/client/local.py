"""`LocalClient`: the calls of `FineTuneClient`, run by `ftjob run` in local processes.

Why: a notebook tries a job on its own machine (CPU or a local GPU) before a cluster sees it,
with the code it will use against the cluster. Each job is a folder under `workdir`
(`<workdir>/<name>/`: the manifest, `run.log` with every rank's output, the summary `ftjob run`
prints, `output/` unless `output.uri` is a local path). The job's status is derived as the
operator would report it: `Running` while the process lives, `Succeeded` or `Failed` by its exit
status, `progress` from rank 0's `train_log.jsonl`, `result` from the run's summary.
`suspend` stops the run with SIGTERM (the ranks save a checkpoint, as when a pod is preempted);
`resume` starts it again on the same output, so it continues from that checkpoint.

What differs from a cluster: there are no Events, all ranks write one log (`logs(rank=...)`
checks the rank and returns that log), labels selectors match `key=value` terms only, and the
runs belong to the client that started them (`close()` stops those still running).
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from ..api import FineTuneJob
from ..api.status import Result
from .documents import Submittable, document_of
from .errors import JobExists, JobFailed, JobNotFound, StateUnreachable, WaitTimeout
from .views import pod_index_of_rank, state_of

STOP_GRACE_S = 60.0


class LocalClient:
    """FineTuneJobs run on this machine; the same calls as `FineTuneClient` (events are empty)."""

    def __init__(self, workdir: str | Path = "ftjob-local", *, poll_seconds: float = 0.5) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.namespace = "local"
        self.poll_seconds = poll_seconds
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the runs this client started that are still running (they keep their checkpoints)."""
        for name in list(self._procs):
            self._stop(name)

    # -- the job ----------------------------------------------------------------------------
    def submit(self, job: Submittable, *, name: str | None = None, namespace: str | None = None) -> FineTuneJob:
        document = document_of(job, name)
        document["metadata"]["namespace"] = self.namespace
        folder = self.workdir / document["metadata"]["name"]
        if (folder / "job.yaml").exists():
            raise JobExists(document["metadata"]["name"], self.namespace)
        folder.mkdir(parents=True)
        (folder / "job.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
        self._start(document["metadata"]["name"])
        return self.get(document["metadata"]["name"])

    def get(self, name: str, *, namespace: str | None = None) -> FineTuneJob:
        folder = self.workdir / name
        if not (folder / "job.yaml").exists():
            raise JobNotFound(name, self.namespace)
        document = yaml.safe_load((folder / "job.yaml").read_text())
        spec = FineTuneJob.from_manifest(document).spec
        document["status"] = self._status(name, spec.training.max_steps)
        return FineTuneJob.from_manifest(document)

    def list(self, selector: str | None = None, *, namespace: str | None = None) -> builtins.list[FineTuneJob]:
        terms = [t.split("=", 1) for t in (selector or "").split(",") if "=" in t]
        jobs = [self.get(p.parent.name) for p in sorted(self.workdir.glob("*/job.yaml"))]
        return [j for j in jobs if all((j.metadata.labels or {}).get(k.strip()) == v.strip() for k, v in terms)]

    def suspend(self, name: str, *, namespace: str | None = None) -> FineTuneJob:
        self.get(name)
        (self.workdir / name / "suspended").touch()
        self._stop(name)
        return self.get(name)

    def resume(self, name: str, *, namespace: str | None = None) -> FineTuneJob:
        job = self.get(name)
        (self.workdir / name / "suspended").unlink(missing_ok=True)
        if state_of(job) != "Running":
            self._start(name)
        return self.get(name)

    def delete(self, name: str, *, namespace: str | None = None, wait: bool = False, timeout: float = 120) -> None:
        """Stop the run and forget the job; its output folder stays, as a claim would."""
        self.get(name)
        self._stop(name)
        folder = self.workdir / name
        for file in ("job.yaml", "suspended", "exit_code", "summary.json", "run.log", "pid"):
            (folder / file).unlink(missing_ok=True)

    def events(self, name: str, *, namespace: str | None = None) -> builtins.list[Any]:
        self.get(name)
        return []

    def wait(
        self,
        name: str,
        until: str | tuple[str, ...] = "Succeeded",
        *,
        timeout: float | None = None,
        on_progress: Callable[[FineTuneJob], None] | None = None,
        namespace: str | None = None,
    ) -> FineTuneJob:
        wanted = (until,) if isinstance(until, str) else tuple(until)
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            job = self.get(name)
            if on_progress is not None and job != last:
                on_progress(job)
            last, state = job, state_of(job)
            if state in wanted:
                return job
            if state == "Failed":
                raise JobFailed(job)
            if state == "Succeeded":
                raise StateUnreachable(job, wanted)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(name, wanted, timeout or 0.0, job)
            time.sleep(self.poll_seconds)

    def logs(
        self,
        name: str,
        rank: int = 0,
        follow: bool = True,
        *,
        namespace: str | None = None,
        tail_lines: int | None = None,
    ) -> Iterator[str]:
        """The run's log (every rank writes to it); with `follow`, until the run has stopped."""
        pod_index_of_rank(self.get(name), rank)  # the same check of the rank as on a cluster
        log = self.workdir / name / "run.log"
        offset, pending = 0, b""
        if tail_lines is not None and log.exists():
            data = log.read_bytes()
            offset = len(data) - len(b"".join(data.splitlines(keepends=True)[-tail_lines:]))
        while True:
            running = self._running(name)  # asked before the read: the tail of a finished run is read
            if log.exists():
                with log.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                offset += len(chunk)
                *lines, pending = (pending + chunk).split(b"\n")
                yield from (line.decode("utf-8", errors="replace") for line in lines)
            if not follow or not running:
                if pending:
                    yield pending.decode("utf-8", errors="replace")
                return
            time.sleep(self.poll_seconds)

    # -- processes ---------------------------------------------------------------------------
    def _start(self, name: str) -> None:
        folder = self.workdir / name
        job = FineTuneJob.from_manifest(yaml.safe_load((folder / "job.yaml").read_text()))
        uri = job.spec.output.uri
        output = uri if uri.startswith("/") else str(folder / "output")
        for stale in ("exit_code", "summary.json"):
            (folder / stale).unlink(missing_ok=True)
        argv = [sys.executable, "-m", "finetune_operator.cli.main", "run", str(folder / "job.yaml"),
                "--output", output, "--no-progress", "--master-port", str(_free_port())]  # fmt: skip
        # No metrics exporter unless asked for: its fixed port would keep two local runs from coexisting.
        env = {"FTJOB_METRICS_PORT": "off", **os.environ}
        with (folder / "run.log").open("ab") as log, (folder / "summary.json").open("wb") as summary:
            self._procs[name] = subprocess.Popen(
                argv, stdout=summary, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=folder, env=env
            )
        (folder / "pid").write_text(str(self._procs[name].pid))

    def _running(self, name: str) -> bool:
        proc = self._procs.get(name)
        if proc is None:
            return False
        code = proc.poll()
        if code is None:
            return True
        (self.workdir / name / "exit_code").write_text(str(code))
        del self._procs[name]
        return False

    def _stop(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the launcher and its ranks: they save and stop
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._running(name)

    def _status(self, name: str, max_steps: int | None) -> dict[str, Any]:
        folder = self.workdir / name
        running = self._running(name)
        code_file = folder / "exit_code"
        code = int(code_file.read_text()) if code_file.exists() else None
        status: dict[str, Any] = {"state": "Running"}
        if not running:
            if (folder / "suspended").exists():
                status["state"] = "Suspended"
            elif code == 0:
                status["state"] = "Succeeded"
            else:
                tail = (folder / "run.log").read_text(errors="replace").splitlines()[-5:] if code is not None else []
                reason = "Stopped" if code is None or code > 128 or code < 0 else "Error"
                status["state"] = "Failed"
                status["lastFailure"] = {"reason": reason, "message": "\n".join(tail)[-4000:], "exitCode": code}
        job = FineTuneJob.from_manifest(yaml.safe_load((folder / "job.yaml").read_text()))
        uri = job.spec.output.uri
        progress = _progress(Path(uri if uri.startswith("/") else folder / "output") / "train_log.jsonl", max_steps)
        if progress:
            status["progress"] = progress
        if status["state"] == "Succeeded":
            status["result"] = _result(folder / "summary.json")
        return status


def _progress(log: Path, max_steps: int | None) -> dict[str, Any] | None:
    if not log.exists():
        return None
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip().startswith("{")]
    steps = [e for e in entries if "loss" in e and isinstance(e.get("step"), int)]
    if not steps:
        return None
    last = steps[-1]
    progress: dict[str, Any] = {"step": last["step"], "loss": last.get("loss")}
    if last.get("tokens_per_second") is not None:
        progress["tokensPerSecond"] = float(last["tokens_per_second"])
    if max_steps:
        progress["totalSteps"] = max_steps
        progress["percent"] = min(100, 100 * last["step"] // max_steps)
        progress["summary"] = f"{last['step']}/{max_steps} ({progress['percent']}%)"
        seconds = [float(e["seconds"]) for e in steps[-10:] if isinstance(e.get("seconds"), (int, float))]
        if seconds:
            progress["etaSeconds"] = int(max(0, max_steps - last["step"]) * sum(seconds) / len(seconds))
    progress["lastUpdateTime"] = dt.datetime.fromtimestamp(log.stat().st_mtime, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {k: v for k, v in progress.items() if v is not None}


def _result(summary_file: Path) -> dict[str, Any]:
    """The run's summary (the JSON line `ftjob run` prints), cut to the fields of status.result."""
    lines = [line for line in summary_file.read_text().splitlines() if line.strip().startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    fields = {field.alias or key for key, field in Result.model_fields.items()}
    kept = {k: v for k, v in summary.items() if k in fields and k != "tracking" and v is not None}
    return Result.from_wire(kept).to_wire()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
