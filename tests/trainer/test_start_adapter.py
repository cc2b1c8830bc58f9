"""A job starts from a finished job's adapter (`model.adapter` = its `status.result.adapterUri`).

Through the real entrypoint on two gloo ranks, the tiny model: an SFT job trains an adapter on the
secret code; a second SFT job that starts from it evaluates, before its first step, exactly where
the first one ended; a DPO job that starts from it compares against it (its first step is DPO's
log 2 with no margin, which a reference of the bare base would not give) and exports one adapter
on the same base. An adapter of another rank, or none at all, fails before training with the field
named."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

LORA = {"r": 8, "alpha": 16, "dropout": 0.0}
SFT_DATA = {"format": "messages", "maxSeqLength": 48, "validationSplit": 0.05}
ONE_RANK = {"numNodes": 1, "gpusPerNode": 0}


def run_job(launch: Callable[..., Run], where: Path, base: Path, data: str, *, timeout: int = 400, **spec: Any) -> Run:
    manifest = job_manifest(str(base), data, "/out", **spec)
    run = launch(render_config(where / "config", manifest), where / "out", tag=where.name)
    run.wait(timeout)
    return run


def local(uri: str) -> Path:
    assert uri.startswith("file:///"), uri  # `ftjob run`-style output: a local folder, named as a URI
    return Path(uri.removeprefix("file://"))


@pytest.mark.timeout(1200)
def test_sft_then_sft_and_dpo_from_its_adapter(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run]
) -> None:
    sft = run_job(
        launch, tmp_path / "sft", tiny_model_dir, "builtin://secret-code", dataset=SFT_DATA,
        method={"type": "lora", "lora": LORA}, training={"maxSteps": 8, "learningRate": 0.01},
    )  # fmt: skip
    assert sft.proc.returncode == 0, sft.log()[-3000:]
    first = sft.summary()
    adapter = first["adapterUri"]
    assert (local(adapter) / "adapter_config.json").is_file()

    # SFT on: the first evaluation (before any step) scores the adapter as the first job left it
    more = run_job(
        launch, tmp_path / "more", tiny_model_dir, "builtin://secret-code", dataset=SFT_DATA,
        model={"uri": str(tiny_model_dir), "adapter": adapter}, method={"type": "lora", "lora": LORA},
        training={"maxSteps": 2, "learningRate": 0.01},
    )  # fmt: skip
    assert more.proc.returncode == 0, more.log()[-3000:]
    assert more.summary()["evalLossBefore"] == pytest.approx(first["evalLoss"], abs=1e-5)
    assert first["evalLoss"] < first["evalLossBefore"] - 0.1, first  # the adapter learned something

    # DPO from the SFT adapter: its reference is that adapter, frozen
    dpo = run_job(
        launch, tmp_path / "dpo", tiny_model_dir, "builtin://secret-code-preference",
        dataset={"format": "preference", "maxSeqLength": 48, "validationSplit": 0.05},
        model={"uri": str(tiny_model_dir), "adapter": adapter},
        method={"type": "dpo", "lora": LORA}, training={"maxSteps": 4, "learningRate": 0.01},
    )  # fmt: skip
    assert dpo.proc.returncode == 0, dpo.log()[-3000:]
    steps = [e for e in dpo.train_log() if "loss" in e]
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert steps[0]["rewards_chosen"] == pytest.approx(0.0, abs=1e-6)
    assert steps[0]["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert any(abs(e["reward_margin"]) > 1e-4 for e in steps[1:]), steps  # the trained adapter moved off it
    # the bare base scores the pairs differently from the SFT adapter: a base reference would have shown a margin
    before = next(e["eval"] for e in dpo.train_log() if "eval" in e)
    assert before["eval_reward_margin"] == pytest.approx(0.0, abs=1e-6), before
    exported = local(dpo.summary()["adapterUri"])
    config = json.loads((exported / "adapter_config.json").read_text())
    assert config["r"] == LORA["r"] and not (exported / "reference").exists(), sorted(
        p.name for p in exported.iterdir()
    )


@pytest.mark.timeout(600)
def test_an_adapter_of_another_shape_or_none_fails_naming_the_field(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run]
) -> None:
    sft = run_job(
        launch, tmp_path / "sft", tiny_model_dir, "builtin://secret-code", dataset=SFT_DATA, resources=ONE_RANK,
        method={"type": "lora", "lora": LORA}, training={"maxSteps": 1, "globalBatchSize": 2},
    )  # fmt: skip
    assert sft.proc.returncode == 0, sft.log()[-3000:]
    adapter = sft.summary()["adapterUri"]
    wrong = run_job(
        launch, tmp_path / "wrong", tiny_model_dir, "builtin://secret-code", dataset=SFT_DATA, resources=ONE_RANK,
        model={"uri": str(tiny_model_dir), "adapter": adapter}, training={"maxSteps": 1, "globalBatchSize": 2},
        method={"type": "lora", "lora": {**LORA, "r": 4}},
    )  # fmt: skip
    assert wrong.proc.returncode == 1
    assert wrong.termination().startswith("ConfigError: method.lora.r is 4 but the adapter's rank is 8"), (
        wrong.termination()
    )
    missing = run_job(
        launch, tmp_path / "missing", tiny_model_dir, "builtin://secret-code", dataset=SFT_DATA, resources=ONE_RANK,
        model={"uri": str(tiny_model_dir), "adapter": str(tmp_path / "nowhere")}, method={"type": "lora", "lora": LORA},
        training={"maxSteps": 1, "globalBatchSize": 2},
    )  # fmt: skip
    assert missing.proc.returncode == 1
    assert missing.termination().startswith(
        f"ModelNotFound: model.adapter '{tmp_path / 'nowhere'}': no LoRA adapter"
    ), missing.termination()
