"""A pod asked to stop saves its work first: SIGTERM stops the ranks at a step boundary with a checkpoint.

A Kueue preemption, a spot reclaim, an eviction and a node drain all reach a rank as SIGTERM.
Raising at once (what a rank does when the launcher stops it because a peer failed) would throw
away every step since the last checkpoint. So while the training loop runs, SIGTERM only sets a
flag. At each step boundary the ranks sum their flags in the all-reduce the step already makes
(no extra collective), so every rank learns of the stop at the same step, even on a node that
got no signal; they then save a checkpoint through the usual path (on s3:// the manifest is
written last) and stop with reason `Preempted`. A SIGTERM that arrives during a save lets the
save finish: after each save one small all-reduce asks again, so a save is never made twice.

Repeated SIGTERMs are one request: the kubelet (or the process node) signals the container, the
entrypoint forwards it to the launcher's tree and the launcher to its ranks, so one stop arrives
up to three times. The hard limit is the grace period: the entrypoint and the launcher SIGKILL
the ranks after FTJOB_STOP_GRACE_SECONDS, and the kubelet the pod after its
terminationGracePeriodSeconds; the operator sizes both from a save (`render/stop_grace.py`). A
save cut short commits nothing (a `.tmp-` folder, no manifest), so the resume takes the
checkpoint before it.

Before the loop (loading, the rendezvous, the first evaluation) there is nothing new to save,
and once the launcher is stopping the ranks because one failed (its `stopping` file) there is no
gang left to save with: there SIGTERM raises `StoppedBySignal` at once, as it always did.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType

from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.api.pod_env import PodEnv
from finetune_trainer.errors import TrainerError
from finetune_trainer.outcome import STOPPING_FILE, StoppedBySignal

PREEMPTED_FILE = "preempted.json"
"""In the run-state folder: the line local rank 0 leaves once the stop's checkpoint is complete."""
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
"""The entrypoint's exit code after a preemption: stopped by SIGTERM, as a shell reports it."""


class Preempted(TrainerError):
    """Raised on every rank once the checkpoint of an agreed stop is saved: the run ends here (not a
    failure: `worker.run_rank` catches it before its failure path)."""

    reason = TerminationReason.PREEMPTED

    def __init__(self, step: int, total: int, checkpoint: str) -> None:
        self.step, self.total, self.checkpoint = step, total, checkpoint
        super().__init__(
            f"{self.reason}: asked to stop (SIGTERM); stopped at the boundary of step {step} "
            f"of {total} after saving checkpoint {checkpoint}: no step is lost"
        )


class _Stop:
    deferred = False
    requested = False


_stop = _Stop()


def install() -> None:
    """This rank's SIGTERM handler (before anything else runs in it)."""
    _stop.deferred = _stop.requested = False
    signal.signal(signal.SIGTERM, _on_sigterm)


def defer() -> None:
    """From here on (the training loop) SIGTERM asks for a stop at the next step boundary."""
    _stop.deferred = True


def flag() -> float:
    """This rank's vote at a boundary: 1.0 once it was asked to stop."""
    return 1.0 if _stop.requested else 0.0


def _peer_failed() -> bool:
    state_dir = os.environ.get(PodEnv.FTJOB_RUN_STATE_DIR)
    return bool(state_dir) and (Path(str(state_dir)) / STOPPING_FILE).exists()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _stop.deferred and not _peer_failed():
        _stop.requested = True
        return
    name = signal.Signals(signum).name
    raise StoppedBySignal(f"stopped by {name} (another rank failed, or the pod is stopping)")
