"""A fork server for the tests' `ftjob train` runs: the node launcher's imports, paid once.

Every `ftjob train` a trainer test starts is a fresh interpreter whose node launcher imports
torch, DeepSpeed, peft and the training loop (~7 CPU-s) before it forks its ranks. The trainer
tier starts about a hundred of them. This server (one per test process, started on first use)
imports that preload once, with the environment every run shares, and forks each run from
itself: the child takes a session of its own, its log file as stdout and stderr, the run's
environment and working directory, and runs `python -m finetune_trainer --config DIR` as
`__main__` (what `ftjob train` execs: the operator's CLI never imports the trainer, so a
forked `ftjob train` would start a fresh interpreter and lose the preload). Its `launch.train`
then finds the preload imported and forks the node launcher
instead of starting an interpreter (`node_launcher.holds_preload`); the ranks are forked from
the launcher as on any CPU node. Everything after the imports is the production code path.

What differs from a fresh process is only what the imports read from the environment when
they ran, so a run whose environment differs from the server's in anything but the per-run
variables (RUN_VARIABLES) is started as a fresh interpreter instead (`training_runs.start_train`
decides), as is every run with FTJOB_TEST_FORK_SERVER=0.

Protocol (this module's `main`, over its stdin and stdout, one JSON object per line): a request
{"module", "argv", "env", "cwd", "log"} is answered by {"id", "pid"}; when the child exits, the server
writes its exit code (a signal N as -N, as Popen reports it) to STATUS_DIR/<id>.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
CLI_MODULE = "finetune_operator.cli.main"
TRAINER_MODULE = "finetune_trainer"
"""What `ftjob train --config DIR` execs, as `python -m finetune_trainer --config DIR`."""
RUN_VARIABLES = ("FTJOB_", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "AWS_", "MLFLOW_", "PYTEST_CURRENT_TEST")
"""Prefixes of the variables a run may set differently from the server's environment: each is
read when the run uses it, never by an import (the preload does not import mlflow or boto3;
pytest sets PYTEST_CURRENT_TEST to each test's name)."""
SWITCH = "FTJOB_TEST_FORK_SERVER"
START_TIMEOUT_S = 300.0


def differs(server_env: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The variables, besides RUN_VARIABLES, whose value in `env` is not the server's."""
    keys = set(server_env) | set(env)
    return sorted(k for k in keys if not k.startswith(RUN_VARIABLES) and server_env.get(k) != env.get(k))


@dataclass
class ForkedRun:
    """A run forked by the server, used like the Popen of a fresh `ftjob train`."""

    pid: int
    status_file: Path
    server: subprocess.Popen[str]
    args: list[str] = field(default_factory=list)
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.status_file.exists():
            text = self.status_file.read_text().strip()
            if text:
                self.returncode = int(text)
        if self.returncode is None and self.server.poll() is not None and not psutil.pid_exists(self.pid):
            raise RuntimeError(f"the fork server died (exit {self.server.returncode}) before run {self.pid} ended")
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.05)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The test side: starts the server with `env`, hands it runs, stops it at exit."""

    def __init__(self, env: Mapping[str, str], status_dir: Path) -> None:
        self.env = dict(env)
        self.status_dir = status_dir
        status_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fork_server", str(status_dir)],
            env=self.env,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        atexit.register(self.stop)
        ready = self._read(START_TIMEOUT_S)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the fork server did not start: {ready}")

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            raise RuntimeError(f"the fork server answered nothing within {timeout:.0f} s (exit {self.proc.poll()})")
        return dict(json.loads(line))

    def start(self, module: str, args: list[str], env: Mapping[str, str], cwd: Path, log: Path) -> ForkedRun:
        """Fork `python -m MODULE ARGS`."""
        assert self.proc.stdin is not None
        request = {"module": module, "argv": args, "env": dict(env), "cwd": str(cwd), "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self._read(60.0)
        return ForkedRun(int(reply["pid"]), self.status_dir / str(reply["id"]), self.proc, args)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.status_dir, ignore_errors=True)


_SERVERS: dict[str, ForkServer] = {}


def server_for(env: Mapping[str, str], status_dir: Path) -> ForkServer | None:
    """This process's server, started with `env` on first use; None when switched off."""
    if env.get(SWITCH, "1") == "0":
        return None
    if "server" not in _SERVERS:
        _SERVERS["server"] = ForkServer(env, status_dir)
    return _SERVERS["server"]


# --- the server process ------------------------------------------------------------------


def _child_setup(log: str, cwd: str) -> None:
    """What Popen(start_new_session=True, stdout=log, stderr=STDOUT, cwd=cwd) does for a fresh run."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's stdin, kept for its life)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (block-buffered, as for a file)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    os.chdir(cwd)


def _reap(running: dict[int, int], status_dir: Path) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        run_id = running.pop(pid, None)
        if run_id is not None:
            tmp = status_dir / f".{run_id}"
            tmp.write_text(str(os.waitstatus_to_exitcode(status)))
            tmp.rename(status_dir / str(run_id))


def main(status_dir: str) -> int:
    from finetune_trainer.pod import node_launcher

    for name in node_launcher.preload_modules(os.environ):
        node_launcher.import_preloaded(name)
    import finetune_operator.cli.main  # noqa: F401  (the run's own module, imported once too)
    import finetune_trainer.pod.launch  # noqa: F401

    out = sys.stdout
    print(json.dumps({"ready": True}), file=out, flush=True)
    running: dict[int, int] = {}
    next_id = 0
    folder = Path(status_dir)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        _reap(running, folder)
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:  # the test process is gone
            return 0
        request = json.loads(line)
        next_id += 1
        setup = functools.partial(_child_setup, request["log"], request["cwd"])
        child = node_launcher.fork_rank(request["module"], request["argv"], request["env"], setup=setup)
        running[child.pid] = next_id
        print(json.dumps({"id": next_id, "pid": child.pid}), file=out, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
