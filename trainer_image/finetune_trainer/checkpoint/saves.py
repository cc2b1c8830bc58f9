"""Resumable checkpoints that a kill at any moment cannot corrupt, and that outlive a re-plan.

Every rank writes its part and its RNG state into `checkpoints/.tmp-step-N`; after a
barrier, rank 0 writes `trainer_state.json` there last and renames the folder to
`step-N`. A folder named `step-*` is therefore complete by construction; `.tmp-*`
leftovers of a killed save are deleted on the next start. The data position is a pure
function of the global step and the global batch (see `EpochSampler`), and is also
recorded for humans.

Two formats, named in `trainer_state.json` (`checkpointFormat`) beside the strategy that
wrote it (`strategy`: ZeRO stage, offload, micro-batch, accumulation, world size):
- `trainable` (LoRA, QLoRA): the consolidated trainable state of `portable`; any ZeRO
  stage, offload, micro-batch or world size loads it, and the frozen base is not saved.
- `deepspeed` (full fine-tuning): DeepSpeed's own shards. Under another ZeRO stage or world
  size they are converted once to a universal checkpoint cached beside them
  (`step-N_universal`, see `universal`); the few pairs that cannot be converted are refused
  with a `ConfigError` naming the field, instead of DeepSpeed's bare assertion on every restart.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api.pod_contract import CheckpointFormat, CheckpointState, TerminationReason
from finetune_operator.api.strategy import Strategy
from finetune_trainer.checkpoint import universal
from finetune_trainer.errors import TrainerError
from finetune_trainer.faults import fault_point

STATE_FILE = "trainer_state.json"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class OutputFull(TrainerError, RuntimeError):
    """The output volume is full (ENOSPC) or over quota (EDQUOT) while saving a checkpoint."""

    reason = TerminationReason.OUTPUT_FULL


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


ALMOST_FULL_BYTES = 64 * 2**20
"""torch's zip writer reports a full disk as "unexpected pos" without the errno: a failed
write with less than this left on the volume is taken as a full volume."""


def output_full(exc: BaseException, root: Path, step: int) -> OutputFull | None:
    """The clear root cause for a save that failed for lack of space, else None."""
    cause: BaseException | None = exc
    while cause is not None and not (isinstance(cause, OSError) and cause.errno in NO_SPACE):
        cause = cause.__cause__ or cause.__context__
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = -1
    if cause is None and not (0 <= free < ALMOST_FULL_BYTES):
        return None
    intact = newest(root)
    kept = f"the previous checkpoint {intact.path.name} is intact" if intact else "no earlier checkpoint exists"
    return OutputFull(
        f"no space left on the output volume ({root}, {free / 2**20:.1f} MiB free) while saving checkpoint "
        f"{step_dir_name(step)}; {kept}: give the output claim more space or lower "
        "spec.training.checkpointsToKeep"
    )


@contextlib.contextmanager
def _space_checked(root: Path, tmp: Path, step: int) -> Iterator[None]:
    """Writes into the save folder `tmp`: a failure for lack of space becomes `OutputFull`, and
    the incomplete folder is removed at once to give the space back."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        full = output_full(exc, root, step)
        if full is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise full from exc


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass(frozen=True)
class Found:
    path: Path
    step: int
    state: CheckpointState


def complete_checkpoints(root: Path) -> list[Found]:
    """Complete checkpoints, oldest first."""
    found: list[Found] = []
    if not root.is_dir():
        return found
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        state_file = child / STATE_FILE
        if match and state_file.is_file():
            try:
                state = CheckpointState.from_file(state_file.read_text())
            except (OSError, ValueError):
                continue
            found.append(Found(child, int(match.group(1)), state))
    return sorted(found, key=lambda f: f.step)


def newest(root: Path) -> Found | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to `corrupt-step-N` (kept for inspection, never loaded,
    never pruned); rank 0 only."""
    target = path.with_name(f"corrupt-{path.name}")
    suffix = 1
    while target.exists():
        target = path.with_name(f"corrupt-{path.name}.{suffix}")
        suffix += 1
    path.rename(target)
    return target


def remove_partial(root: Path) -> list[str]:
    """Delete leftovers of interrupted saves (rank 0, before anyone reads)."""
    removed = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(TMP_PREFIX):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
    return removed


def prune(root: Path, keep: int) -> None:
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
        shutil.rmtree(universal.universal_path(old.path), ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


FORMAT_TRAINABLE = CheckpointFormat.TRAINABLE
FORMAT_DEEPSPEED = CheckpointFormat.DEEPSPEED


def check_deepspeed_resume(found: Found, strategy: Strategy) -> bool:
    """Whether DeepSpeed shards written under another ZeRO stage or world size must be converted
    (full fine-tuning); a `ConfigError` naming the field where they cannot be (see `universal`)."""
    saved = found.state.strategy
    if saved is None:
        return False  # written before strategies were recorded: let DeepSpeed try
    universal.check(found.path, saved, strategy)
    return universal.needs_conversion(saved, strategy)


def save(
    engine: Any,
    root: Path,
    step: int,
    state: CheckpointState,
    *,
    rank: int,
    barrier: Any,
    portable_state: bool = False,
) -> Path:
    """Write a checkpoint collectively; returns the final folder.

    `portable_state` writes the strategy-independent trainable state (LoRA, QLoRA)
    instead of DeepSpeed's shards.
    """
    import torch

    from finetune_trainer.checkpoint import portable

    tmp_tag = f"{TMP_PREFIX}{step_dir_name(step)}"
    tmp = root / tmp_tag
    final = root / step_dir_name(step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    barrier()
    with _space_checked(root, tmp, step):
        if portable_state:
            tmp.mkdir(parents=True, exist_ok=True)  # every rank writes its RNG state there
            portable.save(engine, tmp, rank)
        else:
            engine.save_checkpoint(str(root), tag=tmp_tag, save_latest=False)
        torch.save(rng_state(), tmp / f"rng_state_rank{rank}.pt")
    state = state.model_copy(update={"checkpoint_format": FORMAT_TRAINABLE if portable_state else FORMAT_DEEPSPEED})
    barrier()
    if rank == 0:
        fault_point("save", step, once_in=root.parent)
        state_path = tmp / STATE_FILE
        with _space_checked(root, tmp, step), state_path.open("w") as fh:
            fh.write(state.to_file())
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # a re-save of the same step after a resume
            shutil.rmtree(final)
        shutil.rmtree(universal.universal_path(final), ignore_errors=True)  # converted from what is replaced
        tmp.rename(final)
        _fsync_dir(root)
    barrier()
    return final


def load(engine: Any, found: Found, dist: Any, strategy: Strategy) -> bool:
    """Restore engine (weights, optimizer, scheduler) and this rank's RNG under `strategy`;
    returns whether DeepSpeed shards were converted for it. `dist`: `rank` and `sum` (collective)."""
    import torch

    from finetune_trainer.checkpoint import portable

    converted = False
    if found.state.checkpoint_format == FORMAT_TRAINABLE:
        portable.load(engine, found.path)
    elif check_deepspeed_resume(found, strategy):
        universal.load(engine, universal.ensure(found.path, dist))
        converted = True
    else:
        path, tag = found.path.parent, found.path.name
        loaded, _ = engine.load_checkpoint(str(path), tag=tag, load_module_strict=False)
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {found.path}")
    rng_file = found.path / f"rng_state_rank{dist.rank}.pt"
    if rng_file.exists():
        restore_rng(torch.load(rng_file, weights_only=False))
    return converted
