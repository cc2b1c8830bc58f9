"""A real MLflow tracking server on loopback, for the tests and the demo.

Why: the trainer's experiment tracking is only worth testing against the server users run.
The `mlflow` server package cannot share the project's virtual environment (its graphene
dependency pins python-dateutil below the version the Kubernetes client needs, and pip would
silently downgrade that client), so the server runs from a virtual environment of its own. Its
versions come from the one lock like everything else: the `mlflow-server` dependency group of
uv.lock (a fork of its own), exported and installed with hashes by `locked_venv.group_venv`
(once per export, under `~/.cache/finetune-operator/mlflow/<hash of the export>`). The project's
venv holds only the client (`mlflow-skinny`, the same locked release).

`MlflowServer` starts `mlflow server` with a sqlite backend store and a local artifact root
(served through the server, `--serve-artifacts`, as pods would reach it), on 127.0.0.1 and a
free port, in its own session, and stops it by pid. `stop()` and `start()` again keep the
port, the database and the artifacts: an outage, as a test sees it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from finetune_localcluster.cluster import with_parent_death_signal
from finetune_localcluster.locked_venv import group_venv
from finetune_localcluster.ports import free_port

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0


def server_venv() -> Path:
    """The virtual environment holding the locked `mlflow` server, created on first use."""
    return group_venv("mlflow-server", "mlflow")


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with its store and artifacts under `workdir`."""

    def __init__(self, workdir: Path | str, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "mlflow-server.log"

    def start(self) -> Self:
        venv = server_venv()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "artifacts").mkdir(exist_ok=True)
        argv = [
            str(venv / "bin" / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{self.workdir / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(self.workdir / "artifacts"),
        ]
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
            # No job runner: MLflow 3 otherwise starts a pool of huey consumer processes for its
            # server-side jobs (GenAI evaluation, trace rollups), which the trainer never submits
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        }
        env.pop("PYTHONPATH", None)  # the server's venv, not the project's packages
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                with_parent_death_signal(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
            )
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited; log tail:\n{self._tail()}")
            if self.healthy():
                return
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {START_TIMEOUT_S:.0f} s; log tail:\n{self._tail()}")

    def healthy(self) -> bool:
        try:
            with _opener().open(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        """SIGTERM to the server's session (gunicorn or uvicorn and their workers), then SIGKILL."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def _tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
