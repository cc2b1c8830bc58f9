"""What a run tells the operator when it ends: a JSON summary, or a one-line root cause.

The container's termination message (`/dev/termination-log`, or FTJOB_TERMINATION_LOG)
is the only channel from a finished pod to the operator. On failure it holds exactly
one line `<Reason>: <message>`, where Reason is one of REASONS: a failure the trainer knows
names its own (`errors.TrainerError`), `classify` has the rules for the rest. `OutOfMemory` is
recognised from CUDA and host allocator errors and MemoryError, so the operator can
re-plan instead of retrying the same strategy. A rank that vanishes without a word
(SIGKILL, exit 137) is `RankKilled`: the kernel's memory killer is one cause, but so are
an eviction or a person; when it was the memory killer, the kubelet reports the
container as OOMKilled, and that is what the operator re-plans on. A rank that ends by SIGABRT
without a word (exit 134: NCCL's watchdog after a collective timeout, or a C++ abort) is
`RankAborted`, never taken for the memory killer. `DataError` (the data is
wrong) and `ConfigError` (a setting cannot work) fail the same way on every restart, so the
operator does not retry them (`TerminationReason.retried`); `DataUnavailable` and
`ModelNotFound` (not found or not fetched) may pass on a later try and are retried.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from finetune_operator.api.pod_contract import (
    MAX_MESSAGE_LINE,
    NETWORK_HINT,
    TERMINATION_LOG,
    TerminationReason,
    TrainingSummary,
    is_out_of_memory_text,
    is_rdma_registration_text,
)
from finetune_operator.api.pod_env import PodEnv
from finetune_trainer.errors import TrainerError

OUT_OF_MEMORY = TerminationReason.OUT_OF_MEMORY
DATA_ERROR = TerminationReason.DATA_ERROR
DATA_UNAVAILABLE = TerminationReason.DATA_UNAVAILABLE
MODEL_NOT_FOUND = TerminationReason.MODEL_NOT_FOUND
CONFIG_ERROR = TerminationReason.CONFIG_ERROR
TRAINING_ERROR = TerminationReason.TRAINING_ERROR
TERMINATED = TerminationReason.TERMINATED
RANK_KILLED = TerminationReason.RANK_KILLED
RANK_ABORTED = TerminationReason.RANK_ABORTED
REASONS = tuple(TerminationReason)
MAX_LINE = MAX_MESSAGE_LINE
SIGKILL_EXIT_CODE = 137
SIGABRT_EXIT_CODE = 134
EXIT_FILE = "rank{rank}.exit"
"""node_launcher.EXIT_FILE: the exit status of the rank whose failure made the launcher stop the others."""
SUMMARY_FILE = "summary.json"
"""In the run-state folder: the summary local rank 0 leaves for the entrypoint."""


class StoppedBySignal(TrainerError):
    """Raised in a rank by SIGTERM (the launcher stopping it after another rank failed)."""

    reason = TERMINATED


def termination_log_path() -> Path:
    return Path(os.environ.get(PodEnv.FTJOB_TERMINATION_LOG, TERMINATION_LOG))


def one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_LINE else flat[: MAX_LINE - 3] + "..."


def is_oom_text(text: str) -> bool:
    return is_out_of_memory_text(text)


def classify(exc: BaseException) -> TerminationReason:
    """The Reason for an exception raised on a rank: a `TrainerError`'s own (unless the message
    quotes an allocator or RDMA failure, `TrainerError.quoted_text_decides`), else the rules for
    foreign exceptions."""
    if isinstance(exc, TrainerError) and not exc.quoted_text_decides:
        return exc.reason
    quoted = _foreign_reason(exc)
    if quoted is not None:
        return quoted
    return exc.reason if isinstance(exc, TrainerError) else TRAINING_ERROR


def _foreign_reason(exc: BaseException) -> TerminationReason | None:
    """What an exception that is not ours, or the text it quotes, says beyond a training error: an
    RDMA memory registration failure (whose text reads like an allocator's), or out of memory
    (MemoryError, torch's OutOfMemoryError, CUDA's or the host allocator's text)."""
    text = str(exc)
    if is_rdma_registration_text(text):
        return TerminationReason.NETWORK_ERROR
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or is_oom_text(text):
        return OUT_OF_MEMORY
    return None


def failure_line(exc: BaseException, rank: int) -> str:
    reason = classify(exc)
    detail = str(exc) or type(exc).__name__
    if reason == TRAINING_ERROR:
        detail = f"{type(exc).__name__}: {detail}"
    if reason == TerminationReason.NETWORK_ERROR:
        detail = f"{NETWORK_HINT} ({type(exc).__name__}: {detail})"
    return one_line(f"{reason}: {detail} (rank {rank})")


def write_rank_failure(state_dir: Path, rank: int, line: str) -> None:
    """Each rank records its own root cause; the entrypoint picks the earliest."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"failure-rank{rank}.json"
    path.write_text(json.dumps({"time": time.time(), "rank": rank, "line": line}))


def clear_rank_failure(state_dir: Path, rank: int) -> None:
    """Withdraw a root cause written ahead of a step that could only end in `os._exit` (it passed)."""
    (state_dir / f"failure-rank{rank}.json").unlink(missing_ok=True)


_PEER_LOSS = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crash|aborted", re.I)


def mark_rank(state_dir: Path, rank: int, event: str) -> None:
    """`started` when a rank begins, `done` when it succeeded: silence in between means it was killed."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / f"rank{rank}.{event}").write_text(str(time.time()))


STOPPING_FILE = "stopping"
"""Written by the node launcher (`node_launcher._mark_stopping`, the time) when a rank's failure
makes it stop the others: ranks killed from then on are its doing."""


def _stopping_since(state_dir: Path) -> float | None:
    try:
        return float((state_dir / STOPPING_FILE).read_text())
    except (OSError, ValueError):
        return None


def _failures(state_dir: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for path in state_dir.glob("failure-rank*.json"):
        try:
            entries.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return entries


def _rank_of(path: Path) -> int:
    return int(path.name.split(".")[0].removeprefix("rank"))


def root_cause(state_dir: Path, node_rank: int) -> tuple[str, int] | None:
    """The line that explains a failed node, and the exit code to use.

    Order: an explicit out-of-memory error; then a rank that vanished without a word
    (SIGKILL, exit 137); then the earliest real error; then the
    consequences (peers losing the connection, ranks stopped by the launcher). A silent rank
    does not outrank a real error written before the launcher began stopping the gang
    (`STOPPING_FILE`, written by `node_launcher._mark_stopping`): the launcher SIGKILLs a rank
    that outlives its grace period, and that rank was stopped, not the cause (a full disk on
    rank 0 was once reported as rank 1's SIGKILL, on a loaded machine).
    """
    entries = _failures(state_dir)
    started = {_rank_of(p) for p in state_dir.glob("rank*.started")}
    ended = {_rank_of(p) for p in state_dir.glob("rank*.done")} | {int(e["rank"]) for e in entries}
    silent = sorted(started - ended)
    oom = [e for e in entries if str(e.get("line", "")).startswith(f"{OUT_OF_MEMORY}:")]
    if oom:
        return str(min(oom, key=lambda e: float(e["time"]))["line"]), 1

    def weight(entry: dict[str, Any]) -> tuple[int, float]:
        line = str(entry.get("line", ""))
        secondary = 2 if line.startswith(TERMINATED) else 1 if _PEER_LOSS.search(line) else 0
        return secondary, float(entry.get("time", 0))

    stop_began = _stopping_since(state_dir)
    error_before_stop = stop_began is not None and any(
        weight(e)[0] == 0 and weight(e)[1] <= stop_began for e in entries
    )
    aborted = [r for r in silent if _exit_status(state_dir, r) in (-signal.SIGABRT, SIGABRT_EXIT_CODE)]
    if aborted and not error_before_stop:
        return _aborted_line(f"rank {', '.join(str(r) for r in aborted)}", node_rank), SIGABRT_EXIT_CODE
    if silent and not error_before_stop:
        ranks = ", ".join(str(r) for r in silent)
        return (
            f"{RANK_KILLED}: rank {ranks} on node {node_rank} died without an error message "
            "(SIGKILL, exit 137: the kernel's memory killer, an eviction, or someone killed it)",
            SIGKILL_EXIT_CODE,
        )
    if not entries:
        return None
    return str(min(entries, key=weight)["line"]), 1


def _exit_status(state_dir: Path, rank: int) -> int | None:
    try:
        return int((state_dir / EXIT_FILE.format(rank=rank)).read_text())
    except (OSError, ValueError):
        return None


def _aborted_line(who: str, node_rank: int) -> str:
    return (
        f"{RANK_ABORTED}: {who} on node {node_rank} aborted without an error message (SIGABRT, exit 134): "
        "NCCL's watchdog ends a rank whose collective outlived the collective timeout (its log has NCCL's "
        "warning and the flight-recorder dump says which collective each rank was in), or a C++ assertion failed"
    )


def launcher_failure_line(returncode: int, node_rank: int) -> tuple[str, int]:
    """Root cause and exit code when no rank left a message (it was killed)."""
    if returncode in (-signal.SIGABRT, SIGABRT_EXIT_CODE):  # the launcher passed on a rank's SIGABRT
        return _aborted_line("a training process", node_rank), SIGABRT_EXIT_CODE
    # -9: the launcher itself was killed; 137: it passed on a rank's SIGKILL (247: DeepSpeed's launcher did).
    if returncode in (-9, 137, 247):
        return (
            f"{RANK_KILLED}: a training process on node {node_rank} was killed by SIGKILL (exit 137)",
            SIGKILL_EXIT_CODE,
        )
    return f"{TRAINING_ERROR}: the node launcher on node {node_rank} exited with code {returncode}", 1


def read_summary(path: Path) -> TrainingSummary:
    """A summary a rank or an earlier run left (summary.json, the completion marker)."""
    try:
        return TrainingSummary.model_validate_json(path.read_text(), strict=False)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{path}: not a training summary: {' '.join(str(exc).split())[:300]}") from None


def write_summary(summary: TrainingSummary) -> None:
    """The termination message of a successful run: the summary the operator puts in `status.result`."""
    write_termination(summary.to_message())


def write_termination(message: str) -> None:
    path = termination_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message if message.endswith("\n") else message + "\n")
    except OSError:
        pass  # not in a pod and not redirected: stdout still has it
