"""A full fine-tuning checkpoint resumed under another ZeRO stage or world size.

Full fine-tuning saves DeepSpeed's own shards: cheap to write (every rank its part), but a
picture of one strategy. When a re-plan or a new `numNodes` changes the ZeRO stage or the
world size, rank 0 converts the checkpoint once with DeepSpeed's
`ds_to_universal` into `<checkpoint>_universal` next to it: one folder per parameter with
its full fp32 value and Adam moments. The others wait outside the collective timeout
(`leader_work`: a large model's conversion outlasts it); the folder is written under a
`.tmp-` name and renamed when complete, so a kill mid-way leaves nothing that looks done,
and the next restart reuses it instead of converting again. The original checkpoint is
only read.

DeepSpeed 0.19's own `checkpoint.load_universal` reads a universal checkpoint only into
the family of stages that wrote it: a ZeRO-3 engine looks for `zero_pp_rank_*` model
states and then fails on `KeyError: 'optimizer_state_dict'` with a ZeRO-1/2 source, and a
ZeRO-1/2 engine fails on `AssertionError: Empty ds_version in checkpoint` with a ZeRO-3
source. So the values are written into the new engine by name through the same accessors
as the LoRA path (`portable.restore`), which work at ZeRO 1-3 with or without CPU
offload; the LR schedule comes from the checkpoint's model states.

Not converted (a `ConfigError` says so): ZeRO-0 on either side (its optimizer state lives
in the model-states file, which `ds_to_universal` does not read) and NVMe offload on either
side (DeepSpeed keeps that optimizer state in swap files outside the shards).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import time
from argparse import Namespace
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Protocol

from finetune_operator.api.strategy import Strategy
from finetune_trainer import leader_work
from finetune_trainer.checkpoint import portable
from finetune_trainer.faults import fault_point
from finetune_trainer.settings import ConfigError

log = logging.getLogger(__name__)

SUFFIX = "_universal"
TMP_PREFIX = ".tmp-"
SHARDING = ("zeroStage", "worldSize")
"""Strategy fields DeepSpeed's own shards depend on (offload and micro-batching do not)."""


class Collective(Protocol):
    rank: int

    def sum(self, values: list[float]) -> list[float]: ...


class ConversionError(RuntimeError):
    """`ds_to_universal` failed on a checkpoint (a `TrainingError`: a restart tries again)."""


def sharding_changes(saved: Strategy, now: Strategy) -> list[str]:
    return [c for c in saved.changes(now) if c.split(":")[0] in SHARDING]


def refusal(saved: Strategy, now: Strategy) -> str | None:
    """Why a checkpoint of `saved` cannot be converted for `now`, or None when it can."""
    stages = (saved.zero_stage, now.zero_stage)
    if 0 in stages and stages != (0, 0):
        return (
            "deepspeed.zeroStage: a ZeRO-0 checkpoint cannot be converted to or from another stage "
            "(allowed: a change between ZeRO 1, 2 and 3, or keep ZeRO-0 on any world size)"
        )
    for side in (saved, now):
        if "nvme" in (side.offload_optimizer, side.offload_params):
            return (
                "deepspeed.offloadOptimizer/offloadParams: a checkpoint cannot be converted to or from NVMe "
                "offload (its optimizer state lives in swap files); allowed: none or cpu"
            )
    return None


def needs_conversion(saved: Strategy, now: Strategy) -> bool:
    """ZeRO 1-3 shards are tied to the stage and world size; ZeRO-0 keeps everything whole."""
    return bool(sharding_changes(saved, now)) and (saved.zero_stage, now.zero_stage) != (0, 0)


def step_of(checkpoint: Path) -> int:
    """The step of a `step-N` folder (0 for another name)."""
    tail = checkpoint.name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def universal_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + SUFFIX)


def convert(checkpoint: Path) -> Path:
    """Rank 0: DeepSpeed shards -> `<checkpoint>_universal` (once; reused when it exists)."""
    from deepspeed.checkpoint import ds_to_universal

    target = universal_path(checkpoint)
    if target.is_dir():
        log.info("reusing %s, converted on an earlier start", target.name)
        return target
    log.warning("converting checkpoint %s to a universal checkpoint %s (once)", checkpoint, target.name)
    began = time.monotonic()
    tmp = target.with_name(TMP_PREFIX + target.name)
    shutil.rmtree(tmp, ignore_errors=True)
    args = Namespace(
        input_folder=str(checkpoint),
        output_folder=str(tmp),
        num_extract_workers=1,  # no process pool inside a rank
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # our saves do not pass DeepSpeed's universal-checkpoint info
    )
    chatter = io.StringIO()
    try:
        with redirect_stdout(chatter):
            ds_to_universal.main(args)
    except Exception as exc:  # a signal leaves the .tmp- folder to the next start's cleanup
        shutil.rmtree(tmp, ignore_errors=True)
        tail = " | ".join(chatter.getvalue().strip().splitlines()[-3:])
        raise ConversionError(f"{type(exc).__name__}: {exc} (ds_to_universal: {tail})") from exc
    finally:
        (checkpoint.parent / "latest_universal").unlink(missing_ok=True)  # written beside the output
    os.sync()  # the files are on disk before the name says the folder is complete
    tmp.rename(target)
    log.info("converted %s in %.1f s", checkpoint.name, time.monotonic() - began)
    return target


def ensure(checkpoint: Path, dist: Collective) -> Path:
    """Collective: rank 0 converts while the others wait outside the collective timeout (a large
    model's conversion outlasts it; see `leader_work`); every rank raises if it failed."""
    error = ""

    def work() -> None:
        nonlocal error
        try:
            fault_point("convert", step_of(checkpoint))
            convert(checkpoint)
        except ConversionError as exc:
            error = str(exc)
        except Exception as exc:  # never leave the other ranks waiting on a rank that is gone
            error = f"{type(exc).__name__}: {exc}"

    leader_work.run(work, doer=dist.rank == 0, doers=1, what=f"converting checkpoint {checkpoint.name}")
    if dist.sum([1.0 if error else 0.0])[0]:
        raise ConversionError(
            f"could not convert checkpoint {checkpoint} to a universal checkpoint for the new strategy: "
            f"{error or 'see rank 0'}; the checkpoint itself is unchanged"
        )
    return universal_path(checkpoint)


def _tensor(path: Path) -> Any:
    import torch

    value = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(value, dict):  # stages 1-2 write {"param": ..., "cat_dim": ...}, stage 3 the bare tensor
        value = value["param"]
    return value.detach().float()


def load(engine: Any, folder: Path) -> dict[str, Any]:
    """Collective: a universal checkpoint into this engine; returns its model states."""
    import torch

    model_states = sorted(folder.glob("*model_states.pt"))
    if not model_states:
        raise ConversionError(f"{folder}: no model states file; delete the folder to convert again")
    meta: dict[str, Any] = torch.load(model_states[0], map_location="cpu", weights_only=False)
    zero = folder / "zero"
    names = sorted(p.name for p in zero.iterdir() if (p / "exp_avg.pt").is_file())

    def lookup(name: str) -> tuple[Any, dict[str, Any]]:
        return _tensor(zero / name / "fp32.pt"), {key: _tensor(zero / name / f"{key}.pt") for key in portable.MOMENTS}

    skipped = int(meta.get("skipped_steps", 0))
    portable.restore(engine, names, lookup, int(meta["global_steps"]) - skipped, meta.get("lr_scheduler"))
    engine.skipped_steps = skipped
    return meta


def check(found_path: Path, saved: Strategy, now: Strategy) -> None:
    """A `ConfigError` naming the field when `saved` -> `now` cannot be converted."""
    why = refusal(saved, now)
    if why is not None and sharding_changes(saved, now):
        raise ConfigError(
            f"checkpoint {found_path} was written by {saved}, this run is {now} "
            f"({'; '.join(sharding_changes(saved, now))}): {why}. Pin the old values, or delete the "
            "checkpoints to start over"
        )
