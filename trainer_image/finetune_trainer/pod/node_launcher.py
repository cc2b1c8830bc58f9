"""The per-node launcher: starts this node's ranks with DeepSpeed's launch contract, without torch.

`python -u -m finetune_trainer.pod.node_launcher --world_info=B64 --node_rank=N --master_addr=A
--master_port=P MODULE ARGS...` starts one `python -u -m MODULE ARGS...` per local slot of the
hostfile's world, with the environment `deepspeed.launcher.launch` gives its ranks (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE, RANK, LOCAL_RANK and
CUDA_VISIBLE_DEVICES of the node's slots), and watches them the same way: when one rank fails,
the others are stopped and the launcher exits with that rank's code (128 + signal for a rank
killed by a signal); on SIGTERM or SIGINT it stops every rank and exits 1.

DeepSpeed's own launcher does the same, but importing it imports torch and DeepSpeed: about
6.5 s of CPU and ~0.7 GB of memory per pod for a process that only starts and watches others.
This one imports the standard library and psutil, and reacts to a rank's exit at once (it
waits on its children instead of polling them every second).

On a CPU-only node (DS_ACCELERATOR=cpu) it imports what a rank imports (torch, DeepSpeed,
peft, the training loop: ~13 s of CPU) once, and forks its ranks from itself, each running
MODULE as `__main__` with its own environment, instead of starting a fresh interpreter per rank
that imports it all again; the forked ranks also share those pages. FTJOB_LAUNCHER_PRELOAD
names other modules to import (comma-separated), or `none` for a fresh interpreter per rank.
A GPU node always starts fresh interpreters: a process forked after CUDA's driver was
initialised cannot use the GPU, and importing these libraries may initialise it.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import importlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

from finetune_trainer.deepspeed_import import import_deepspeed
from finetune_trainer.pod import process_tree, rank_threads

STOP_GRACE_SECONDS = 30.0
"""How long the other ranks get to stop after one failed, before SIGKILL (DeepSpeed's 30 s)."""

RUN_STATE_ENV = "FTJOB_RUN_STATE_DIR"
"""PodEnv.FTJOB_RUN_STATE_DIR (the api package imports pydantic, which the launcher does not load)."""
STOPPING_FILE = "stopping"
"""outcome.STOPPING_FILE: written there when a failed rank makes the launcher stop the others."""
EXIT_FILE = "rank{rank}.exit"
"""outcome.EXIT_FILE: the exit status of the rank whose failure stopped the others (a negative
signal number for a rank killed by a signal), so a rank that died without a word is told apart:
SIGKILL (the memory killer, an eviction) from SIGABRT (NCCL's watchdog, a C++ abort)."""

PRELOAD_ENV = "FTJOB_LAUNCHER_PRELOAD"
"""Comma-separated modules to import once and fork the ranks from (CPU nodes only), or `none`."""
CPU_PRELOAD = ("torch", "deepspeed", "peft", "finetune_trainer.rank.loop")
"""What a training rank imports, preloaded on a CPU node unless FTJOB_LAUNCHER_PRELOAD says otherwise."""


class RankProcess(Protocol):
    """What the launcher needs of a rank process: a `subprocess.Popen` or a `ForkedRank`."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class NodeSlots:
    """Where this node's ranks sit in the world: global ranks in hostfile order."""

    nodes: int
    world_size: int
    global_ranks: tuple[int, ...]
    device_ids: tuple[int, ...]


def decode_world(world_info: str) -> dict[str, list[int]]:
    """The hostfile's world as the launchers pass it: base64 of {host: [local slot, ...]}."""
    world = json.loads(base64.urlsafe_b64decode(world_info))
    if not isinstance(world, dict) or not world:
        raise ValueError(f"--world_info decodes to {world!r}, not a non-empty {{host: [slot, ...]}}")
    return {str(host): [int(s) for s in slots] for host, slots in world.items()}


def node_slots(world: Mapping[str, Sequence[int]], node_rank: int) -> NodeSlots:
    """Global ranks are numbered host by host in the world's order, as DeepSpeed numbers them."""
    hosts = list(world)
    if not 0 <= node_rank < len(hosts):
        raise ValueError(f"--node_rank={node_rank}, but the world has {len(hosts)} nodes")
    first = sum(len(world[h]) for h in hosts[:node_rank])
    mine = world[hosts[node_rank]]
    return NodeSlots(
        nodes=len(hosts),
        world_size=sum(len(s) for s in world.values()),
        global_ranks=tuple(range(first, first + len(mine))),
        device_ids=tuple(mine),
    )


def rank_env(
    base: Mapping[str, str],
    slots: NodeSlots,
    node_rank: int,
    local_rank: int,
    *,
    master_addr: str,
    master_port: int,
    cpus: int | None = None,
) -> dict[str, str]:
    """The environment of one local rank: DeepSpeed's launch contract, and its share of the CPUs
    (`cpus`: those this process may use, by default)."""
    env = dict(base)
    env.update(rank_threads.share(base, len(slots.global_ranks), rank_threads.usable_cpus() if cpus is None else cpus))
    env.update(
        {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(slots.world_size),
            "CROSS_RANK": str(node_rank),
            "CROSS_SIZE": str(slots.nodes),
            "LOCAL_SIZE": str(len(slots.global_ranks)),
            "RANK": str(slots.global_ranks[local_rank]),
            "LOCAL_RANK": str(local_rank),
            "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in slots.device_ids),
        }
    )
    return env


def exit_code(returncode: int) -> int:
    """A rank's exit as the launcher's own: a signal N becomes 128 + N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class ForkedRank:
    """A process forked by `fork_rank` (a rank, or the launcher itself), polled like a Popen."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        """Block until it exits (a signal handler that runs meanwhile does not end the wait)."""
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = 1
                break
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def preload_modules(environ: Mapping[str, str]) -> list[str]:
    """The modules to fork the ranks from, or [] to start each rank as a fresh interpreter."""
    if environ.get("DS_ACCELERATOR") != "cpu":  # PodEnv.DS_ACCELERATOR (the api package imports pydantic)
        if environ.get(PRELOAD_ENV, "none") != "none":
            print(
                f"node launcher: {PRELOAD_ENV} is ignored unless DS_ACCELERATOR=cpu (a forked rank cannot use CUDA)",
                file=sys.stderr,
                flush=True,
            )
        return []
    if PRELOAD_ENV not in environ:
        return list(CPU_PRELOAD)
    names = [m.strip() for m in environ[PRELOAD_ENV].split(",") if m.strip()]
    return [] if names == ["none"] else names


def holds_preload(environ: Mapping[str, str]) -> bool:
    """Whether this process may fork the node launcher instead of starting a new interpreter:
    it has already imported the whole preload the launcher would import (`preload_modules`),
    and it is single-threaded (a thread holding a lock at the fork would leave it held in the
    child). A pod's entrypoint never has (it does not import torch); a test's fork server
    (tests/support/fork_server.py) does, and then skips the launcher's ~7 CPU-s of imports."""
    names = preload_modules(environ)
    if not names or not all(name in sys.modules for name in names):
        return False
    return _single_threaded()


def _single_threaded(exit_wait: float = 2.0) -> bool:
    """No thread but this one. A Python thread that was just joined may still be listed by the
    kernel for a moment while it exits (the model-download thread, on a loaded machine): that
    one is waited for, up to `exit_wait` seconds."""
    deadline = time.monotonic() + exit_wait
    while True:
        try:
            if len(os.listdir("/proc/self/task")) == 1:
                return True
        except OSError:
            return False
        if threading.active_count() > 1 or time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    print(exc.code, file=sys.stderr)  # sys.exit("message"), as the interpreter reports it
    return 1


def _unbuffered_stdio() -> None:
    """sys.stdout and sys.stderr as `python -u` makes them: every write goes to the fd at once."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True))


def fork_rank(
    module: str,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    unbuffered: bool = False,
    setup: Callable[[], None] | None = None,
) -> ForkedRank:
    """Fork a process that runs `module` as __main__ with `env`, as `python -m module args` would
    (`python -u -m` with `unbuffered`). `setup` runs first in the child (its own session, its
    output files). The parent's weakref finalizers (a TemporaryDirectory it holds) stay the
    parent's: the child does not run them when it exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # the launcher's handlers must not run in the child
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
        return ForkedRank(pid)
    code = 1
    try:  # the child: never returns into the launcher's code
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
        _disown_finalizers()
        if setup is not None:
            setup()
        if unbuffered:
            _unbuffered_stdio()
        os.environ.clear()
        os.environ.update(env)
        rank_threads.apply(env)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _disown_finalizers() -> None:
    """In a forked child: the weakref finalizers alive at the fork are not run at its exit."""
    registry = getattr(weakref.finalize, "_registry", {})
    for info in list(registry.values()):
        info.atexit = False


def _stop(ranks: Sequence[RankProcess], grace: float) -> None:
    signalled = [p for proc in ranks if proc.poll() is None for p in process_tree.terminate(proc.pid)]
    if signalled:
        process_tree.finish(signalled, grace)
    for proc in ranks:
        proc.poll()  # reap


def _mark_stopping() -> None:
    """Note when the stop began, so a rank SIGKILLed for outliving its grace is not taken for
    the cause (`outcome.root_cause`)."""
    state_dir = os.environ.get(RUN_STATE_ENV)
    if not state_dir:
        return
    path = os.path.join(state_dir, STOPPING_FILE)
    try:
        if not os.path.exists(path):
            with open(path, "w") as fh:
                fh.write(str(time.time()))
    except OSError as exc:  # the stop goes on; only the report may blame a stopped rank
        print(f"node launcher: cannot write {path}: {exc}", file=sys.stderr)


def _mark_exit(rank: int, code: int) -> None:
    state_dir = os.environ.get(RUN_STATE_ENV)
    if not state_dir:
        return
    path = os.path.join(state_dir, EXIT_FILE.format(rank=rank))
    try:
        with open(path, "w") as fh:
            fh.write(str(code))
    except OSError as exc:  # only the report loses the signal's name
        print(f"node launcher: cannot write {path}: {exc}", file=sys.stderr)


def supervise(
    ranks: Sequence[RankProcess], grace: float = STOP_GRACE_SECONDS, *, global_ranks: Sequence[int] = ()
) -> int:
    """Wait for the ranks; the first failure stops the rest and is the result (its exit status is
    noted for the rank `global_ranks` gives it, in the same order as `ranks`)."""
    rank_of = dict(zip((proc.pid for proc in ranks), global_ranks, strict=False))
    by_pid = {proc.pid: proc for proc in ranks}
    running = set(by_pid)
    while running:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # already reaped (a signal handler's poll)
            break
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        by_pid[pid].returncode = code
        if code != 0:
            print(f"node launcher: rank process {pid} exited with {code}; stopping the others", file=sys.stderr)
            if pid in rank_of:
                _mark_exit(rank_of[pid], code)
            _mark_stopping()
            _stop(ranks, grace)
            return exit_code(code)
    failed = [p.returncode for p in ranks if p.returncode]
    return exit_code(failed[0]) if failed else 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune_trainer.pod.node_launcher", description=__doc__)
    parser.add_argument("--world_info", required=True, help="base64 of the JSON {host: [local slot, ...]}")
    parser.add_argument("--node_rank", type=int, required=True)
    parser.add_argument("--master_addr", required=True)
    parser.add_argument("--master_port", type=int, required=True)
    parser.add_argument("module", help="the rank's module, run as python -u -m MODULE")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def import_preloaded(name: str) -> None:
    """Import one module of the preload (DeepSpeed without its autotuner's MLflow import)."""
    if name == "deepspeed":
        import_deepspeed()
    else:
        importlib.import_module(name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        slots = node_slots(decode_world(args.world_info), args.node_rank)
    except ValueError as exc:
        print(f"node launcher: {exc}", file=sys.stderr, flush=True)
        return 2
    ranks: list[RankProcess] = []
    preload = preload_modules(os.environ)
    try:
        for name in preload:
            import_preloaded(name)
    except Exception as exc:  # the ranks then start as fresh interpreters and report it themselves
        print(f"node launcher: cannot preload {name}: {exc}; starting each rank afresh", file=sys.stderr, flush=True)
        preload = []

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        _stop(ranks, process_tree.grace_seconds())
        sys.exit(1)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)
    for local_rank in range(len(slots.global_ranks)):
        env = rank_env(
            os.environ, slots, args.node_rank, local_rank, master_addr=args.master_addr, master_port=args.master_port
        )
        if preload:
            ranks.append(fork_rank(args.module, args.args, env))
        else:
            ranks.append(subprocess.Popen([sys.executable, "-u", "-m", args.module, *args.args], env=env))
    return supervise(ranks, global_ranks=slots.global_ranks)


if __name__ == "__main__":
    sys.exit(main())
