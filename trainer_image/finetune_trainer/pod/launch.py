"""The pod entrypoint: idle if the job already completed, else launch this node's ranks.

Every pod launches its own ranks (no SSH anywhere; the hostfile only describes the world)
with `python -m finetune_trainer.pod.node_launcher --world_info=... --node_rank=$NODE_RANK
--master_addr=$MASTER_ADDR`: DeepSpeed's per-node launch contract (the environment
`deepspeed --no_ssh --hostfile DIR/hostfile` gives each rank, and its stop-all-on-failure
watch) without importing torch and DeepSpeed in a process that only starts the ranks.
The entrypoint stays the container's main process so that it can turn what the ranks
left behind into the termination message and the exit code the operator reads:
0 with a JSON summary, 143 with `Preempted: ...` when the ranks stopped on SIGTERM after saving a
checkpoint (`preemption`), 137 when a rank was SIGKILLed (the OOM killer), 1 otherwise with
`<Reason>: <message>`. `ftjob run` uses this same function with a localhost hostfile.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from finetune_operator.api.pod_contract import TrainingSummary
from finetune_operator.api.pod_env import CUDA_ALLOCATOR_DEFAULT, PodEnv
from finetune_trainer import outcome, preemption
from finetune_trainer.checkpoint import s3_checkpoints
from finetune_trainer.errors import TrainerError
from finetune_trainer.model.modeling import ModelNotFound
from finetune_trainer.pod import node_launcher, process_tree, s3_inputs
from finetune_trainer.pod.download_gate import DownloadTimeout, download_timeout, gang_ready, within_limit
from finetune_trainer.pod.prefetch import prefetch
from finetune_trainer.settings import ConfigError, JobConfig, env_int, load_config
from finetune_trainer.storage.paths import completion_marker, resolve_uri
from finetune_trainer.tracking.session import TrackingSession, start_session

log = logging.getLogger(__name__)

WORKER_MODULE = "finetune_trainer.rank.worker"
LAUNCHER_MODULE = "finetune_trainer.pod.node_launcher"
DEFAULT_MASTER_PORT = 29500
GANG_SLACK_SECONDS = 60.0
"""How much longer than its own download limit a pod waits for the others' downloads: a slower
peer hits its own limit (and fails, restarting the gang) first."""


@dataclass
class Result:
    exit_code: int
    summary: dict[str, Any] | None
    message: str


def idle_forever(marker: Path) -> int:
    """A restarted pod of a finished job: do nothing until the kubelet stops us."""
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # the handlers before the line that says we idle: a SIGTERM right after it ends the pod with 0,
    # and a bounded wait, since a signal between a check and signal.pause() would be slept through
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"job already completed ({marker}); idling until terminated", flush=True)
    while not stop.wait(1.0):
        pass
    return 0


def world_info(hosts: tuple[tuple[str, int], ...]) -> str:
    """The hostfile's world as DeepSpeed's launcher takes it: base64 of {host: [local slot, ...]}."""
    world = {host: list(range(slots)) for host, slots in hosts}
    return base64.urlsafe_b64encode(json.dumps(world).encode()).decode()


def launcher_args(cfg: JobConfig, node_rank: int, master_addr: str, master_port: int) -> list[str]:
    return [
        f"--world_info={world_info(cfg.hosts)}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
        f"--node_rank={node_rank}",
        WORKER_MODULE,
        "--config",
        str(cfg.directory),
    ]


def launcher_command(cfg: JobConfig, node_rank: int, master_addr: str, master_port: int) -> list[str]:
    return [sys.executable, "-u", "-m", LAUNCHER_MODULE, *launcher_args(cfg, node_rank, master_addr, master_port)]


def start_launcher(
    cfg: JobConfig, node_rank: int, master_addr: str, master_port: int, env: dict[str, str]
) -> subprocess.Popen[bytes] | node_launcher.ForkedRank:
    """The node launcher as `python -u -m finetune_trainer.pod.node_launcher ...`, or forked from this
    process when it already holds the launcher's preload (`node_launcher.holds_preload`)."""
    if node_launcher.holds_preload(env):
        args = launcher_args(cfg, node_rank, master_addr, master_port)
        return node_launcher.fork_rank(LAUNCHER_MODULE, args, env, unbuffered=True)
    return subprocess.Popen(launcher_command(cfg, node_rank, master_addr, master_port), env=env)


def hub_offline(cfg: JobConfig, prefetched: str | None) -> bool:
    """Whether the ranks may run with HF_HUB_OFFLINE=1: the pod prefetched the hub model (and its
    tokenizer) into its cache, and no dataset the ranks read is on the hub. Otherwise every rank
    (8 per pod) asks the hub for the model's files again, and fails where the hub is unreachable."""
    if prefetched is None:
        return False
    data = cfg.job.spec.dataset
    return all(resolve_uri(uri) is not None for uri in (data.uri, data.validation_uri) if uri)


def _rank_env(state_dir: Path, progress: bool, *, offline: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env[PodEnv.FTJOB_RUN_STATE_DIR] = str(state_dir)
    env.setdefault(PodEnv.PYTORCH_CUDA_ALLOC_CONF, CUDA_ALLOCATOR_DEFAULT)
    if offline:  # a user's own HF_HUB_OFFLINE is kept
        env.setdefault(PodEnv.HF_HUB_OFFLINE, "1")
    if progress:
        env[PodEnv.FTJOB_PROGRESS] = "1"
    if PodEnv.DS_ACCELERATOR not in env:  # pods have it from the operator; `ftjob run` may not
        try:
            import torch

            if not torch.cuda.is_available():
                env[PodEnv.DS_ACCELERATOR] = "cpu"
        except ImportError:
            pass
    return env


def node_rank_from_env() -> int:
    """NODE_RANK (the pod-index label, Kubernetes >= 1.28), else the ordinal ending the pod's name.

    Before 1.28 the label is absent, the rendered env var is empty, and every pod would
    otherwise be node 0 and hang at the rendezvous.
    """
    raw = os.environ.get(PodEnv.NODE_RANK, "")
    if raw:
        return int(raw)
    tail = os.environ.get(PodEnv.FTJOB_POD_NAME, "").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def train(config_dir: str | Path, progress: bool = False, idle_when_done: bool = True) -> Result:
    """Run (or skip) this node's part of the job and write the termination message."""
    try:
        cfg, marker = _load(config_dir)
        if not marker.exists():
            _fetch_remote_marker(cfg, marker)  # unreachable past the deadline, refused credentials
        if marker.exists():
            done = outcome.read_summary(marker)
            outcome.write_summary(done)
            code = idle_forever(marker) if idle_when_done else 0
            return Result(code, _wire(done), "already completed")
        node_rank = node_rank_from_env()
        master_addr = os.environ.get(PodEnv.MASTER_ADDR) or cfg.hosts[0][0]
        master_port = env_int(PodEnv.MASTER_PORT, DEFAULT_MASTER_PORT)
        if not 0 <= node_rank < len(cfg.hosts):
            raise ConfigError(f"NODE_RANK={node_rank} but the hostfile lists {len(cfg.hosts)} nodes")
        prefetched = _download(cfg, node_rank, master_addr, master_port)
        s3_inputs.fetch(cfg.job.spec, node_rank)  # unreachable past the deadline, refused credentials, not found
    except TrainerError as exc:  # this process's one report of a failure before the ranks (they report their own)
        message = outcome.one_line(f"{exc.reason}: {exc}")
        outcome.write_termination(message)
        return Result(1, None, message)
    tracking = start_session(cfg) if node_rank == 0 else None
    with tempfile.TemporaryDirectory(prefix="ftjob-run-") as tmp:
        state_dir = Path(tmp)
        rank_env = _rank_env(state_dir, progress, offline=hub_offline(cfg, prefetched))
        proc = start_launcher(cfg, node_rank, master_addr, master_port, rank_env)
        terminated = {"signal": 0}
        signalled: list[Any] = []

        def _forward(signum: int, frame: FrameType | None) -> None:
            # signal the launcher's whole tree while it is whole (ranks may outlive a dead launcher)
            terminated["signal"] = signum
            signalled.extend(process_tree.terminate(proc.pid))

        old = {s: signal.signal(s, _forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            returncode = proc.wait()
            killed = process_tree.finish(signalled) if signalled else []
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        result = _conclude(state_dir, returncode, node_rank, terminated["signal"], killed)
    if tracking is not None:
        try:
            stopped = bool(terminated["signal"]) or result.exit_code == preemption.PREEMPTED_EXIT_CODE
            result = _tracked(tracking, result, marker, stopped=stopped)
        except Exception as exc:  # tracking never fails a run: the result stands without it
            log.warning("tracking: not finished: %s", str(exc)[:300])
    return result


def _tracked(tracking: TrackingSession, result: Result, marker: Path, stopped: bool) -> Result:
    """A succeeded run's summary with its tracking (the last records sent first, for a bounded time);
    after a failure the run is marked FAILED, after a stop signal it is left running."""
    if result.exit_code != 0 or result.summary is None:
        tracking.stop(failed=not stopped)
        return result
    summary = TrainingSummary.model_validate(result.summary, strict=False)
    summary = summary.model_copy(update={"tracking": tracking.finish(summary)})
    outcome.write_summary(summary)
    if marker.exists():  # a pod restarted after success reports the summary with its run
        tmp = marker.with_name(marker.name + ".tmp")
        tmp.write_text(json.dumps(_wire(summary), indent=2, sort_keys=True) + "\n")
        tmp.replace(marker)
    return Result(0, _wire(summary), result.message)


def _load(config_dir: str | Path) -> tuple[JobConfig, Path]:
    """The pod's config and the job's completion marker; ConfigError when either cannot be read."""
    try:
        cfg = load_config(config_dir)
        return cfg, completion_marker(cfg.output)
    except ValueError as exc:  # a hostfile's slots, an output on s3:// without its staging folder
        raise ConfigError(str(exc)) from exc


def _download(cfg: JobConfig, node_rank: int, master_addr: str, master_port: int) -> str | None:
    """The hub model in this pod's cache and, with FTJOB_PREFETCH_MODEL, in every pod's before any
    rank starts. Past its limit this is DownloadTimeout; any other failure is ModelNotFound."""
    try:
        limit = download_timeout()
        deadline = time.monotonic() + limit + GANG_SLACK_SECONDS
        prefetched = within_limit(lambda: prefetch(cfg, node_rank), limit, f"downloading {cfg.job.spec.model.uri}")
        if os.environ.get(PodEnv.FTJOB_PREFETCH_MODEL) == "1":  # every pod has the model before any rank starts
            gang_ready(node_rank, len(cfg.hosts), master_addr, master_port, deadline)
    except DownloadTimeout:
        raise
    except Exception as exc:  # a gated repo without HF_TOKEN, a wrong id, no network
        raise ModelNotFound(f"downloading {cfg.job.spec.model.uri}: {exc}") from exc
    return prefetched


def _fetch_remote_marker(cfg: JobConfig, marker: Path) -> None:
    """With output on s3://, a finished job's marker is in the bucket (the pod's scratch is new)."""
    found = s3_checkpoints.completed(cfg.job.spec)
    if found is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_bytes(found)


def _conclude(state_dir: Path, returncode: int, node_rank: int, signum: int, killed: list[int]) -> Result:
    summary_file = state_dir / outcome.SUMMARY_FILE
    if summary_file.exists() and (returncode == 0 or signum):  # finished within the stop's grace
        summary = outcome.read_summary(summary_file)
        outcome.write_summary(summary)
        return Result(0, _wire(summary), "succeeded")
    preempted = state_dir / preemption.PREEMPTED_FILE
    if preempted.exists():  # the stop's checkpoint is saved, whatever the launcher did after it
        line = outcome.one_line(str(json.loads(preempted.read_text())["line"]))
        outcome.write_termination(line)
        return Result(preemption.PREEMPTED_EXIT_CODE, None, line)
    if signum:
        forced = f" ({len(killed)} of them SIGKILLed after the grace period)" if killed else ""
        name = signal.Signals(signum).name
        message = f"{outcome.TERMINATED}: received {name}; the launcher and every rank stopped{forced}"
        outcome.write_termination(message)
        return Result(128 + signum, None, message)
    found = outcome.root_cause(state_dir, node_rank)
    if found is not None:
        line, code = found
    elif returncode == 0:
        line, code = f"{outcome.TRAINING_ERROR}: the ranks exited 0 without leaving a summary", 1
    else:
        line, code = outcome.launcher_failure_line(returncode, node_rank)
    outcome.write_termination(line)
    return Result(code, None, line)


def _wire(summary: TrainingSummary) -> dict[str, Any]:
    return summary.model_dump(by_alias=True, exclude_none=True)


def main(config_dir: str) -> int:
    result = train(config_dir)
    stream = sys.stdout if result.exit_code == 0 else sys.stderr
    print(json.dumps(result.summary, sort_keys=True) if result.summary else result.message, file=stream, flush=True)
    return result.exit_code
