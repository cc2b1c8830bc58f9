"""The tests' fork server (tests/support/fork_server.py) is faithful: a job forked from it trains
exactly as the same job started as a fresh `ftjob train` interpreter (same losses, gradient
norms, adapter and summary), its node launcher is forked rather than started afresh, and a run
whose environment differs in what an import reads starts as a fresh interpreter."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.support.fork_server import ForkedRun
from tests.support.training_runs import Run, adapter_tensors, job_manifest, render_config, wait_for

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(600)]


def _launcher_cmdlines(run: Run) -> list[list[str]]:
    """The command lines of the run's descendants, read while it trains."""
    lines: list[list[str]] = []

    def seen() -> bool:
        try:
            lines[:] = [p.cmdline() for p in psutil.Process(run.proc.pid).children(recursive=True)]
        except psutil.Error:
            return True
        return len(lines) >= 3  # the launcher and its two ranks

    wait_for(seen, 120)
    return lines


def test_a_forked_run_trains_exactly_like_a_fresh_interpreter(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    import torch

    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        deepspeed={"zeroStage": 2},
        training={"maxSteps": 4, "checkpointEverySteps": 2, "learningRate": 0.01},
    )
    config = render_config(tmp_path / "config", manifest)
    fresh = launch(config, tmp_path / "fresh", fresh=True)
    fresh_tree = _launcher_cmdlines(fresh)
    assert fresh.wait(300) == 0, fresh.log()[-3000:]
    forked = launch(config, tmp_path / "forked")
    forked_tree = _launcher_cmdlines(forked)
    assert forked.wait(300) == 0, forked.log()[-3000:]

    assert isinstance(fresh.proc, subprocess.Popen) and isinstance(forked.proc, ForkedRun)
    # a fresh run execs the node launcher; a forked one forks it (and its ranks) from the server
    assert any("finetune_trainer.pod.node_launcher" in " ".join(c) for c in fresh_tree), fresh_tree
    assert forked_tree and not any("finetune_trainer.pod.node_launcher" in " ".join(c) for c in forked_tree), (
        forked_tree
    )

    def steps(run: Run) -> list[tuple[int, float, float]]:
        return [(e["step"], e["loss"], e["grad_norm"]) for e in run.train_log() if "loss" in e]

    assert steps(forked) == steps(fresh) and len(steps(fresh)) == 4
    want, got = adapter_tensors(tmp_path / "fresh" / "adapter"), adapter_tensors(tmp_path / "forked" / "adapter")
    assert want.keys() == got.keys() and want
    assert all(torch.equal(want[k], got[k]) for k in want)
    summary = {k: v for k, v in forked.summary().items() if k not in ("wallSeconds", "adapterUri")}
    assert summary == {k: v for k, v in fresh.summary().items() if k not in ("wallSeconds", "adapterUri")}
    assert "Traceback" not in forked.log()


def test_a_run_with_its_own_import_time_environment_starts_afresh(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(str(tiny_model_dir), str(reverse_jsonl), "/out", training={"maxSteps": 1})
    config = render_config(tmp_path / "config", manifest)
    run = launch(config, tmp_path / "out", env={"HF_HOME": str(tmp_path / "hf")})
    assert isinstance(run.proc, subprocess.Popen)
    assert run.wait(300) == 0, run.log()[-3000:]
