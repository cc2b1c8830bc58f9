"""Two real gloo ranks under every ZeRO stage (with optimizer offload from stage 1) for each method,
in bf16 as on a GPU: each run saves a checkpoint mid-way and its result.

bf16 runs DeepSpeed's 16-bit optimizer wrappers (ZeRO-0: `FP16_UnfusedOptimizer` with fp32
masters; ZeRO 1-3: fp32 partitions), whose optimizer state the checkpoint must reach: a ZeRO-0
bf16 run failed its first save (`PortableStateError: ... no optimizer state 'exp_avg'`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.training_runs import METHODS, Run, adapter_tensors, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STRATEGIES = [
    {"zeroStage": 0, "offloadOptimizer": "none"},
    {"zeroStage": 1, "offloadOptimizer": "cpu"},
    {"zeroStage": 2, "offloadOptimizer": "cpu"},
    {"zeroStage": 3, "offloadOptimizer": "cpu", "offloadParams": "cpu"},
]
WRAPPERS = {0: "FP16_UnfusedOptimizer", 1: "DeepSpeedZeroOptimizer", 2: "DeepSpeedZeroOptimizer",
            3: "DeepSpeedZeroOptimizer_Stage3"}  # fmt: skip
"""The optimizer DeepSpeed wraps the client AdamW in for a bf16 run, by ZeRO stage."""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: f"zero{s['zeroStage']}-{s['offloadOptimizer']}")
def test_two_ranks_train_and_save(
    tmp_path: Path,
    tiny_model_dir: Path,
    reverse_jsonl: Path,
    launch: Callable[..., Run],
    method: str,
    strategy: dict[str, object],
) -> None:
    import torch

    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        method=METHODS[method],
        deepspeed=strategy,
        training={"maxSteps": 3, "precision": "bf16", "learningRate": 0.01, "checkpointEverySteps": 2},
    )
    out = tmp_path / "out"
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(220) == 0, run.log()[-3000:]
    stage = strategy["zeroStage"]
    assert isinstance(stage, int)
    assert f"bf16 on CPU (optimizer {WRAPPERS[stage]})" in run.log(), run.log()[-3000:]
    saved = out / "checkpoints" / "step-00000002"
    assert (saved / "trainer_state.json").is_file(), sorted(out.rglob("*"))
    if method != "full":  # the portable state: fp32 masters and both Adam moments of every trainable weight
        state = torch.load(saved / "trainable_state.pt", weights_only=True)
        assert state["params"] and state["moments"]["exp_avg"].keys() == state["params"].keys()
        assert all(t.dtype == torch.float32 for t in state["params"].values())
    summary = run.summary()
    assert summary["steps"] == 3 and summary["tokens"] > 0
    losses = run.losses()
    assert sorted(losses) == [1, 2, 3] and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    folder = out / ("model" if method == "full" else "adapter")
    tensors = adapter_tensors(folder)
    assert all(bool(torch.isfinite(t).all()) for t in tensors.values())
    if method == "full":
        assert any("layers.0.mlp.down_proj" in k for k in tensors)
        assert (folder / "config.json").exists()
    else:
        lora_b = [t for k, t in tensors.items() if "lora_B" in k]
        assert lora_b and any(float(t.abs().sum()) > 0 for t in lora_b)
        assert (folder / "adapter_config.json").exists()
    assert (out / "COMPLETED.json").exists()


@pytest.mark.timeout(240)
def test_zero3_bf16_lora_that_trains_embeddings_initialises(
    tmp_path: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    """The demo model trains its embeddings and head beside LoRA (`modules_to_save`): in bf16 those
    copies are bf16 and peft's adapters fp32, and ZeRO-3 (without offload) refused the mix in
    `deepspeed.initialize` (`assert len(set(t.dtype for t in tensors)) == 1`): the e2e OOM re-plan
    to ZeRO-3 restarted into that assertion until its budget was gone."""
    manifest = job_manifest(
        "builtin://tiny-llama",
        str(reverse_jsonl),
        "/out",
        deepspeed={"zeroStage": 3, "offloadOptimizer": "none", "offloadParams": "none"},
        training={"maxSteps": 3, "precision": "bf16", "checkpointEverySteps": 2},
    )
    out = tmp_path / "out"
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(220) == 0, run.log()[-3000:]
    assert "bf16 on CPU (optimizer DeepSpeedZeroOptimizer_Stage3)" in run.log(), run.log()[-3000:]
    assert sorted(run.losses()) == [1, 2, 3]
    assert (out / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()
