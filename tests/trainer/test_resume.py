"""Resume equivalence: a run SIGKILLed mid-epoch (or mid-save), or stopped by SIGTERM (a
preemption, which saves the step it stops at), and resumed matches an uninterrupted one.

Two gloo ranks, ZeRO-2 (optimizer states sharded per rank), gradient accumulation 2 and
LoRA dropout on, so the test covers the engine, optimizer shards, LR scheduler, data
position and per-rank RNG state. Losses of every step after the resume point and the
final adapter must agree within a tight tolerance.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.training_runs import Run, job_manifest, render_config, start_train, wait_for

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 10
CHECKPOINT_EVERY = 3
TOLERANCE = 1e-5


def _manifest(model: Path, data: Path) -> dict[str, Any]:
    return job_manifest(
        str(model),
        str(data),
        "/out",
        method={"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.1}},
        training={
            "maxSteps": STEPS,
            "microBatchSize": 2,
            "globalBatchSize": 8,
            "checkpointEverySteps": CHECKPOINT_EVERY,
            "checkpointsToKeep": 2,
            "learningRate": 0.005,
            "warmupRatio": 0.2,
        },
    )


def _adapter(out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(out / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> tuple[dict[int, float], dict[str, Any], Path]:
    """The uninterrupted run (module-scoped: both scenarios compare against it)."""
    from finetune_trainer.data.builtin_datasets import reverse_words_records
    from tests.support.training_runs import write_jsonl

    root = tmp_path_factory.mktemp("reference")
    rows = [{k: r[k] for k in ("instruction", "input", "output")} for r in reverse_words_records(200, seed=7)]
    data = write_jsonl(root / "data.jsonl", rows)
    run = start_train(render_config(root / "config", _manifest(tiny_model_dir, data)), root / "out")
    try:
        assert run.wait(240) == 0, run.log()[-3000:]
    finally:
        run.kill()
    return run.losses(), _adapter(root / "out"), data


def _assert_equivalent(resumed: Run, reference: tuple[dict[int, float], dict[str, Any], Path], first: int) -> None:
    ref_losses, ref_adapter, _ = reference
    losses = resumed.losses()
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step in range(first, STEPS + 1):
        assert losses[step] == pytest.approx(ref_losses[step], rel=TOLERANCE, abs=TOLERANCE), f"step {step}"
    adapter = _adapter(resumed.output)
    assert adapter.keys() == ref_adapter.keys()
    for key, tensor in adapter.items():
        assert float((tensor - ref_adapter[key]).abs().max()) <= TOLERANCE, key


def _resume_point(run_log: list[dict[str, Any]]) -> int:
    return max(int(e["step"]) for e in run_log if "loss" in e)


def _killed_after(launch: Callable[..., Run], config: Path, out: Path, stop_at: int) -> Run:
    """A run whose whole pod is SIGKILLed once step `stop_at` is logged: the ranks SIGSTOP
    themselves there, so the kill cannot race the loop."""
    first = launch(config, out, tag="first", env={"FTJOB_FAULT_STOP": f"step:{stop_at}"})
    assert wait_for(
        lambda: (
            any(e.get("step", 0) >= stop_at and "loss" in e for e in first.train_log()) or first.proc.poll() is not None
        ),
        timeout=240,
    )
    os.killpg(first.proc.pid, signal.SIGKILL)  # the whole pod dies at once
    first.proc.wait()
    return first


@pytest.mark.timeout(600)
def test_sigkill_mid_epoch_then_resume_matches(
    tmp_path: Path,
    tiny_model_dir: Path,
    reference: tuple[dict[int, float], dict[str, Any], Path],
    launch: Callable[..., Run],
) -> None:
    config = render_config(tmp_path / "config", _manifest(tiny_model_dir, reference[2]))
    out = tmp_path / "out"
    stop_at = CHECKPOINT_EVERY + 2  # between two checkpoints: steps after the last one are lost
    first = _killed_after(launch, config, out, stop_at)
    assert not (out / "COMPLETED.json").exists(), "the run finished before it could be killed"
    killed_at = _resume_point(first.train_log())
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert saved, "no checkpoint before the kill"
    resume_from = int(saved[-1].split("-")[1])
    assert (resume_from, killed_at) == (CHECKPOINT_EVERY, stop_at)

    second = launch(config, out, tag="second")
    assert second.wait(240) == 0, second.log()[-3000:]
    assert f"resumed from {out / 'checkpoints' / saved[-1]}" in second.log()
    summary = json.loads(second.termination())  # the operator's Event comes from this when no scrape saw the resume
    assert (summary["steps"], summary["resumedFromStep"], summary["checkpointConverted"]) == (STEPS, resume_from, False)
    logged = second.train_log()  # both runs': the save and load times benchmarks/checkpoint_storage.py reads
    assert [e["step"] for e in logged if "resume" in e] == [resume_from]
    assert resume_from in [e["step"] for e in logged if e.get("checkpoint", {}).get("seconds", -1) >= 0]
    _assert_equivalent(second, reference, resume_from + 1)


@pytest.mark.timeout(600)
def test_sigkill_during_save_keeps_previous_checkpoint(
    tmp_path: Path,
    tiny_model_dir: Path,
    reference: tuple[dict[int, float], dict[str, Any], Path],
    launch: Callable[..., Run],
) -> None:
    config = render_config(tmp_path / "config", _manifest(tiny_model_dir, reference[2]))
    out = tmp_path / "out"
    kill_step = 2 * CHECKPOINT_EVERY
    first = launch(config, out, tag="first", env={"FTJOB_FAULT_KILL": f"save:{kill_step}"})
    code = first.wait(240)
    assert code == 137, first.log()[-3000:]
    assert first.termination().startswith("RankKilled: "), first.termination()
    leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == [f".tmp-step-{kill_step:08d}"]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == [f"step-{CHECKPOINT_EVERY:08d}"]

    second = launch(config, out, tag="second")
    assert second.wait(240) == 0, second.log()[-3000:]
    assert "removed incomplete checkpoints" in second.log()
    _assert_equivalent(second, reference, CHECKPOINT_EVERY + 1)


@pytest.mark.timeout(600)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_and_says_so(
    tmp_path: Path,
    tiny_model_dir: Path,
    reference: tuple[dict[int, float], dict[str, Any], Path],
    launch: Callable[..., Run],
) -> None:
    config = render_config(tmp_path / "config", _manifest(tiny_model_dir, reference[2]))
    out = tmp_path / "out"
    stop_at = 2 * CHECKPOINT_EVERY + 1
    _killed_after(launch, config, out, stop_at)
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert saved == [f"step-{CHECKPOINT_EVERY:08d}", f"step-{2 * CHECKPOINT_EVERY:08d}"], saved
    damaged = out / "checkpoints" / saved[-1] / "trainable_state.pt"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])  # a disk that lost the tail

    second = launch(config, out, tag="second")
    assert second.wait(240) == 0, second.log()[-3000:]
    log = second.log()
    assert f"checkpoint {out / 'checkpoints' / saved[-1]} is damaged" in log
    assert f"kept as corrupt-{saved[-1]}, falling back to the previous checkpoint" in log
    assert f"resumed from {out / 'checkpoints' / saved[0]}" in log
    assert (out / "checkpoints" / f"corrupt-{saved[-1]}" / "trainable_state.pt").exists(), "nothing is deleted"
    _assert_equivalent(second, reference, CHECKPOINT_EVERY + 1)


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs as the full output disk needs root")
def test_a_full_output_disk_names_the_cause_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
    tiny_model_dir: Path,
    reference: tuple[dict[int, float], dict[str, Any], Path],
    launch: Callable[..., Run],
) -> None:
    import subprocess

    from finetune_trainer.checkpoint.saves import complete_checkpoints

    one = _tree_bytes(reference[2].parent / "out" / "checkpoints" / f"step-{STEPS - 1:08d}")
    out = tmp_path / "out"
    out.mkdir()
    size_kib = (2 * one + one // 2) // 1024 + 64  # two checkpoints fit, a third never does
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(out)], check=True)
    try:
        config = render_config(tmp_path / "config", _manifest(tiny_model_dir, reference[2]))
        run = launch(config, out, tag="full")
        assert run.wait(240) != 0, "the run finished on a disk too small for its third checkpoint"
        line = run.termination()
        assert line.startswith("OutputFull: no space left on the output volume"), line
        assert f"checkpoint step-{3 * CHECKPOINT_EVERY:08d}" in line, line
        assert f"the previous checkpoint step-{2 * CHECKPOINT_EVERY:08d} is intact" in line, line
        assert "checkpointsToKeep" in line
        saved = complete_checkpoints(out / "checkpoints")
        assert [f.step for f in saved] == [CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY]
        assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp-")], "space given back"
        import torch

        state = torch.load(saved[-1].path / "trainable_state.pt", weights_only=True)
        assert state, "the previous checkpoint still loads"
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


def _stopped_ranks(run: Run) -> list[psutil.Process]:
    """The processes of the run that SIGSTOPped themselves at a fault point."""
    stopped = []
    for proc in psutil.Process(run.proc.pid).children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_STOPPED:
                stopped.append(proc)
        except psutil.NoSuchProcess:
            continue
    return stopped


def _sigterm_while_stopped(run: Run, ranks: int) -> None:
    """Once `ranks` processes stopped themselves at the fault point: SIGTERM the whole pod (as the
    process node, standing in for the kubelet, does), then let the ranks go on with it pending."""
    assert wait_for(lambda: len(_stopped_ranks(run)) == ranks or run.proc.poll() is not None, 240), run.log()[-3000:]
    stopped = _stopped_ranks(run)
    assert len(stopped) == ranks, run.log()[-3000:]
    os.killpg(run.proc.pid, signal.SIGTERM)
    for proc in stopped:
        os.kill(proc.pid, signal.SIGCONT)


def _checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))


PREEMPT_ENV = {"FTJOB_STOP_GRACE_SECONDS": "240"}
"""The launcher's and the entrypoint's grace for the ranks' stop (the operator renders it from a save)."""
TRIALS = int(os.environ.get("FTJOB_TEST_PREEMPTION_TRIALS", "1"))
"""Preemptions at independent random steps; the figure in docs/guides/preemption.md runs more of them."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("trial", range(TRIALS))
def test_sigterm_at_a_random_step_saves_that_step_and_the_resume_loses_nothing(
    trial: int,
    tmp_path: Path,
    tiny_model_dir: Path,
    reference: tuple[dict[int, float], dict[str, Any], Path],
    launch: Callable[..., Run],
) -> None:
    """A preemption at a random step: the ranks stop at the next step boundary with a checkpoint of
    that step (or at once after the save of a checkpoint step), the pod ends `Preempted`, and the
    resumed run takes each step exactly once and ends with the uninterrupted run's adapter."""
    paused_after = random.SystemRandom().randint(1, STEPS - 2)  # SIGTERM comes after this step's all-reduce
    stop_at = paused_after if paused_after % CHECKPOINT_EVERY == 0 else paused_after + 1
    config = render_config(tmp_path / "config", _manifest(tiny_model_dir, reference[2]))
    out = tmp_path / "out"
    first = launch(config, out, tag="first", env={**PREEMPT_ENV, "FTJOB_FAULT_STOP": f"step:{paused_after}"})
    _sigterm_while_stopped(first, ranks=2)
    code = first.wait(300)
    detail = f"SIGTERM after step {paused_after}: {first.termination()} {first.log()[-3000:]}"
    assert code == 128 + signal.SIGTERM, detail
    assert first.termination().startswith(
        f"Preempted: asked to stop (SIGTERM); stopped at the boundary of step {stop_at} of {STEPS} "
        f"after saving checkpoint step-{stop_at:08d}: no step is lost"
    ), detail
    assert _checkpoint_steps(out)[-1] == stop_at, detail
    assert _resume_point(first.train_log()) == stop_at, detail  # no step past the checkpoint
    assert not (out / "COMPLETED.json").exists()

    second = launch(config, out, tag="second")
    assert second.wait(240) == 0, second.log()[-3000:]
    assert f"resumed from {out / 'checkpoints' / f'step-{stop_at:08d}'}" in second.log(), detail
    steps = [e["step"] for e in second.train_log() if "loss" in e]  # both runs': 0 steps lost, none redone
    assert steps == list(range(1, STEPS + 1)), (paused_after, steps)
    _assert_equivalent(second, reference, stop_at + 1)


@pytest.mark.timeout(600)
def test_sigterm_during_a_save_finishes_it_and_stops_there(
    tmp_path: Path,
    tiny_model_dir: Path,
    reference: tuple[dict[int, float], dict[str, Any], Path],
    launch: Callable[..., Run],
) -> None:
    """Rank 0 is paused inside the save of a checkpoint step when SIGTERM arrives: the save is
    finished, not cut short, and the ranks stop right after it without taking another step or
    saving the same step twice."""
    step = 2 * CHECKPOINT_EVERY
    config = render_config(tmp_path / "config", _manifest(tiny_model_dir, reference[2]))
    out = tmp_path / "out"
    first = launch(config, out, tag="first", env={**PREEMPT_ENV, "FTJOB_FAULT_STOP": f"save:{step}"})
    _sigterm_while_stopped(first, ranks=1)  # only rank 0 passes the save's fault point
    code = first.wait(300)
    assert code == 128 + signal.SIGTERM, first.log()[-3000:]
    assert first.termination().startswith(f"Preempted: asked to stop (SIGTERM); stopped at the boundary of step {step}")
    assert _checkpoint_steps(out) == [CHECKPOINT_EVERY, step]
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert _resume_point(first.train_log()) == step
    saves = [e["step"] for e in first.train_log() if "checkpoint" in e]
    assert saves == [CHECKPOINT_EVERY, step], saves
