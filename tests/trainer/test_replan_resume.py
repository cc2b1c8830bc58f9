"""A re-plan keeps the work (tests/support/replan_chains.py says how a chain runs and what it
compares): the bf16 LoRA, full fine-tuning and full offload chains, and a full fine-tuning
checkpoint converted to a universal one once. The LoRA ladder and QLoRA chains are in
test_replan_resume_ladder.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.replan_chains import CHECKPOINT_EVERY, OTHER_CHAINS, TOLERANCE, Strategy, check_chain, manifest
from tests.support.training_runs import Run, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("chain", OTHER_CHAINS)
def test_resume_under_each_replanned_strategy_continues_the_run(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run], chain: str
) -> None:
    check_chain(tmp_path, tiny_model_dir, reverse_jsonl, launch, chain)


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.timeout(900)
def test_full_fine_tuning_converts_a_checkpoint_once(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    """ZeRO-2 shards read at ZeRO-3 failed every gang restart on DeepSpeed's bare assertion. Now
    the first ZeRO-3 start converts them into `step-N_universal` (and is killed right after);
    the second reuses that folder instead of converting again; the shards themselves are
    never written; and pruning the checkpoint takes its universal copy with it."""
    out = tmp_path / "out"
    steps = 2 * CHECKPOINT_EVERY + 2
    first_step = CHECKPOINT_EVERY + 1
    checkpoint_dir = out / "checkpoints" / f"step-{CHECKPOINT_EVERY:08d}"
    converted = checkpoint_dir.with_name(checkpoint_dir.name + "_universal")

    def config(name: str, zero: int) -> Path:
        job = manifest(tiny_model_dir, reverse_jsonl, Strategy(zero), steps, "full", "fp32")
        return render_config(tmp_path / name, job)

    zero2 = launch(config("config-2", 2), out, tag="zero2", env={"FTJOB_FAULT_KILL": f"step:{CHECKPOINT_EVERY + 2}"})
    assert zero2.wait(300) != 0 and checkpoint_dir.is_dir(), zero2.log()[-3000:]
    # one rank of the node tokenises the dataset; the restarts below read its arrays (any strategy)
    assert "dataset tokenised by 1 of 2 ranks" in zero2.log(), zero2.log()[-3000:]
    assert len(list((out / ".cache" / "data").iterdir())) == 1
    shards = _digests(checkpoint_dir)
    interrupted = zero2.losses()[first_step]

    zero3 = config("config-3", 3)
    converting = launch(zero3, out, tag="convert", env={"FTJOB_FAULT_KILL": f"step:{first_step}"})
    assert converting.wait(300) != 0, converting.log()[-3000:]
    log = converting.log()
    assert "dataset tokenised by 0 of 2 ranks" in log, log[-3000:]
    assert f"converting checkpoint {checkpoint_dir} to a universal checkpoint" in log, log[-3000:]
    assert (converted / "zero").is_dir() and not list(out.glob("checkpoints/.tmp-*")), sorted(out.rglob("*"))
    assert _digests(checkpoint_dir) == shards
    after_conversion = converting.losses()[first_step]

    reusing = launch(zero3, out, tag="reuse")
    assert reusing.wait(300) == 0, reusing.log()[-3000:]
    log = reusing.log()
    assert f"reusing {converted.name}" in log and "converting checkpoint" not in log, log[-3000:]
    assert "DeepSpeed shards converted to the universal checkpoint" in log, log[-3000:]
    resumed = reusing.losses()[first_step]
    print(f"step {first_step}: ZeRO-2 {interrupted!r}, converted {after_conversion!r}, reused {resumed!r}")
    tolerance = TOLERANCE["fp32"]
    assert after_conversion == pytest.approx(interrupted, rel=tolerance, abs=tolerance)
    assert resumed == pytest.approx(interrupted, rel=tolerance, abs=tolerance)
    assert not checkpoint_dir.exists() and not converted.exists()  # pruned with the checkpoint after step 6
