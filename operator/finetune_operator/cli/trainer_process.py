"""The trainer as a program: how `ftjob train` and `ftjob run` reach it without importing it.

The operator never imports the trainer (import-linter: "The operator never imports the
trainer"); the API is the one package both depend on. The trainer needs torch, DeepSpeed and
the rest, which the trainer image and an install with the `trainer` extra have and the
operator image has not. So the CLI starts `python -m finetune_trainer` (TRAINER_MODULE, with
this interpreter, so with the same packages):

- `ftjob train` becomes the trainer (`exec_trainer`): the same pid, so in a pod the trainer is
  the container's main process, receives the kubelet's SIGTERM itself, and its exit status is
  the container's, with no process in between to forward or translate anything.
- `ftjob run` starts it as a child (`run_trainer`) and reports its result afterwards. The child
  shares this process's stdout, stderr and process group; SIGTERM and SIGINT sent to `ftjob run`
  are passed on to it (a SIGTERM is a preemption: the ranks save the step they stopped at and
  the trainer exits 143), and its exit status comes back as a shell shows it (a death by
  signal N as 128 + N).

Where the trainer or one of its core packages is missing, both say which and how to get
them instead of failing in a traceback (`missing_trainer`: a lookup, nothing is imported).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

TRAINER_MODULE = "finetune_trainer"
"""Run as `python -m finetune_trainer` (its `__main__`); never imported here."""
TRAINER_PACKAGES = (TRAINER_MODULE, "torch", "deepspeed", "transformers", "peft")
"""What a run cannot start without: the trainer and the packages every rank imports first."""
MISSING_TRAINER_EXIT_CODE = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class TrainerResult:
    """What the trainer reported (`--result FILE`), or what its exit status alone says."""

    exit_code: int
    summary: dict[str, Any] | None
    message: str


def missing_trainer(command: str, packages: Sequence[str] = TRAINER_PACKAGES) -> str | None:
    """A message naming the packages this interpreter cannot import, or None when all are there."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"ftjob {command}: the trainer cannot run here: {sys.executable} has no {', '.join(missing)}. "
        "It runs in the trainer image (its command is `ftjob train`); elsewhere install the trainer "
        "with `pip install 'finetune-operator[trainer]'` (the operator image has no trainer)"
    )


def trainer_command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", TRAINER_MODULE, *args]


def exec_trainer(args: Sequence[str]) -> NoReturn:
    """Replace this process with `python -m finetune_trainer ARGS`."""
    command = trainer_command(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


def exit_status(returncode: int) -> int:
    """A child's status as a shell shows it: a death by signal N (Popen's -N) is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_process(command: Sequence[str]) -> int:
    """Run `command` as a child in this process group, passing SIGTERM and SIGINT on to it; its status.

    A stop signal that arrives before the child exists is sent to it once it does."""
    child: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if child:
            child[0].send_signal(signum)  # a no-op once the child is reaped
        else:
            pending.append(signum)

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    sys.stdout.flush()  # what this process printed comes before the child's output
    sys.stderr.flush()
    try:
        child.append(subprocess.Popen(list(command)))
        for signum in pending:
            child[0].send_signal(signum)
        returncode = child[0].wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return exit_status(returncode)


def run_trainer(args: Sequence[str], result_file: Path) -> TrainerResult:
    """`python -m finetune_trainer ARGS --result RESULT_FILE` as a child (`run_process`); what it reported."""
    status = run_process(trainer_command([*args, "--result", str(result_file)]))
    try:
        record = json.loads(result_file.read_text())
    except (OSError, ValueError):
        return TrainerResult(status, None, _without_result(status))
    summary = record.get("summary")
    return TrainerResult(status, summary if isinstance(summary, dict) else None, str(record.get("message", "")))


def _without_result(status: int) -> str:
    if status > 128:
        try:
            name = signal.Signals(status - 128).name
        except ValueError:
            name = f"signal {status - 128}"
        return f"the trainer ({TRAINER_MODULE}) was stopped by {name} before it reported a result"
    return f"the trainer ({TRAINER_MODULE}) exited {status} without reporting a result (its output above says why)"
