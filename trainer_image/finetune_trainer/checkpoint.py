"""Resumable checkpoints that a kill at any moment cannot corrupt.

Every rank writes its DeepSpeed shards and RNG state into `checkpoints/.tmp-step-N`;
after a barrier, rank 0 writes `trainer_state.json` there last and renames the folder
to `step-N`. A folder named `step-*` is therefore complete by construction; `.tmp-*`
leftovers of a killed save are deleted on the next start. The data position is a pure
function of the global step (see `EpochSampler`), and is also recorded for humans.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass(frozen=True)
class Found:
    path: Path
    step: int
    state: dict[str, Any]


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
                state = json.loads(state_file.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            found.append(Found(child, int(match.group(1)), state))
    return sorted(found, key=lambda f: f.step)


def newest(root: Path) -> Found | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fault_point(where: str, step: int) -> None:
    """Fault injection for the resume tests: FTJOB_FAULT_KILL=<where>:<step> SIGKILLs this rank
    there; FTJOB_FAULT_STOP=<where>:<step> SIGSTOPs it, so a test can kill the whole pod at a
    known step instead of racing the training loop."""
    here = f"{where}:{step}"
    if os.environ.get("FTJOB_FAULT_KILL") == here:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("FTJOB_FAULT_STOP") == here:
        os.kill(os.getpid(), signal.SIGSTOP)


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


def save(engine: Any, root: Path, step: int, state: dict[str, Any], *, rank: int, barrier: Any) -> Path:
    """Write a checkpoint collectively; returns the final folder."""
    import torch

    tmp_tag = f"{TMP_PREFIX}{step_dir_name(step)}"
    tmp = root / tmp_tag
    final = root / step_dir_name(step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    barrier()
    engine.save_checkpoint(str(root), tag=tmp_tag, save_latest=False)
    torch.save(rng_state(), tmp / f"rng_state_rank{rank}.pt")
    barrier()
    if rank == 0:
        fault_point("save", step)
        state_path = tmp / STATE_FILE
        with state_path.open("w") as fh:
            json.dump(state, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # a re-save of the same step after a resume
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(root)
    barrier()
    return final


def load(engine: Any, found: Found, rank: int) -> None:
    """Restore engine (weights, optimizer, scheduler) and this rank's RNG."""
    import torch

    path, tag = found.path.parent, found.path.name
    loaded, _ = engine.load_checkpoint(str(path), tag=tag, load_module_strict=False)
    if loaded is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {found.path}")
    rng_file = found.path / f"rng_state_rank{rank}.pt"
    if rng_file.exists():
        restore_rng(torch.load(rng_file, weights_only=False))
