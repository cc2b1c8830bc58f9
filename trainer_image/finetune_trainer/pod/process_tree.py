"""Stopping everything the node launcher started, not just the launcher.

The entrypoint starts `finetune_trainer.pod.node_launcher`, which starts the ranks. Signals to the
launcher alone are not enough: a launcher that dies leaves its ranks training (one of them
at 100 % CPU). So on SIGTERM or SIGINT the
entrypoint walks the launcher's process tree while it is still whole, sends SIGTERM to
every process in it (a training rank stops at the next step boundary with a checkpoint, see
`preemption`; one still setting up raises `StoppedBySignal` and leaves its root cause), and
SIGKILLs what is still there after a grace period (a rank spinning in C++ never runs its
Python signal handler). In a pod the operator sizes that grace for a checkpoint save
(`PodEnv.FTJOB_STOP_GRACE_SECONDS`, spelled out here: this module loads no pydantic). The tree
stays in the entrypoint's process group, so whoever kills that group (a test, a process node
standing in for the kubelet) still kills it all. Zombies count as gone: they hold nothing, and
only their parent can reap them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

DEFAULT_GRACE_SECONDS = 15.0


def grace_seconds() -> float:
    """How long the ranks get between SIGTERM and SIGKILL (FTJOB_STOP_GRACE_SECONDS)."""
    try:
        return max(0.0, float(os.environ.get("FTJOB_STOP_GRACE_SECONDS", DEFAULT_GRACE_SECONDS)))
    except ValueError:
        return DEFAULT_GRACE_SECONDS


def terminate(pid: int) -> list[psutil.Process]:
    """SIGTERM `pid` and every process under it; the processes signalled."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    return tree


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
    return left


def _wait(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while True:
        if os.getpid() == 1:  # a container's init inherits the orphans: reap them
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
        alive = _alive(procs)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def finish(procs: list[psutil.Process], grace: float | None = None) -> list[int]:
    """Wait for the signalled processes; SIGKILL what outlives the grace period. The pids killed."""
    alive = _wait(procs, grace_seconds() if grace is None else grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _wait(alive, 10.0)
    return [p.pid for p in alive]
