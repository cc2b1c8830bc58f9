"""A CPU rank computes in the job's precision, as a GPU rank does; only fp16 can fall back, and says so.

Before, every CPU run computed in fp32 and switched bf16/fp16 off in DeepSpeed's config, so no
test ran the 16-bit optimizer wrappers of a GPU run (a ZeRO-0 bf16 job failed its first
checkpoint on GPU only). DeepSpeed's CPU accelerator runs bf16 on any x86 CPU; it accepts fp16
only where oneDNN has fp16 kernels ("Type fp16 is not supported on your device" elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from finetune_operator.api.job import FineTuneJob
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.model import modeling
from tests.support.training_runs import Run, job_manifest, qlora_model, render_config

pytestmark = [pytest.mark.trainer]


def _spec(precision: str) -> FineTuneJobSpec:
    return FineTuneJob.from_manifest(job_manifest("/m", "/d.jsonl", "/out", training={"precision": precision})).spec


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("precision", "cpu_fp16", "computed", "enabled"),
    [
        ("bf16", False, "bf16", "bf16"),
        ("fp32", False, "fp32", None),
        ("fp16", True, "fp16", "fp16"),  # a CPU with AVX512-FP16/AMX-FP16: DeepSpeed accepts fp16
        ("fp16", False, "bf16", "bf16"),  # elsewhere: bf16, the 16-bit type it accepts
    ],
)
def test_a_cpu_rank_keeps_the_jobs_precision_and_only_fp16_falls_back(
    precision: str, cpu_fp16: bool, computed: str, enabled: str | None
) -> None:
    compute = modeling.compute_settings(_spec(precision), on_gpu=False, cpu_fp16=cpu_fp16)
    assert compute.precision == computed
    assert bool(compute.note) == (computed != precision)
    if compute.note:
        assert "Type fp16 is not supported on your device" in compute.note and "computing in bf16" in compute.note
    rendered = {"bf16": {"enabled": precision == "bf16"}, "fp16": {"enabled": precision == "fp16", "loss_scale": 0}}
    config = modeling.effective_deepspeed_config(rendered, compute)
    assert {k for k in ("bf16", "fp16") if config[k]["enabled"]} == ({enabled} if enabled else set())
    assert config["fp16"]["loss_scale"] == 0  # the rest of the rendered block is kept


@pytest.mark.timeout(60)
def test_a_gpu_rank_runs_sdpa_with_the_masks_the_plan_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner counts each layer's additive mask for packed GPU rows (no varlen kernel in the
    image); the trainer must then not switch to flash-attention where one happens to be importable."""
    import sys
    import types

    from finetune_operator.plan.search.activations import activation_bytes
    from finetune_operator.plan.workload import workload_from_spec

    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    compute = modeling.compute_settings(_spec("bf16"), on_gpu=True)
    assert compute.attn_implementation == "sdpa"
    padded, packed = (
        workload_from_spec(FineTuneJob.from_manifest(job_manifest(
            "builtin://tiny-llama", "/d.jsonl", "/out", training={"precision": "bf16"},
            resources={"numNodes": 1, "gpusPerNode": 1}, dataset={"packing": packing},
        )).spec)
        for packing in (False, True)
    )  # fmt: skip
    # each layer's SDPA keeps a 16-bit additive copy of the mask: as much for packed rows as for padded
    for checkpointing in (False, True):
        assert activation_bytes(packed, 2, checkpointing) == activation_bytes(padded, 2, checkpointing)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_fp16_job_runs_and_saves_on_this_cpu_and_says_how(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    """An fp16 job at ZeRO-0 (`FP16_UnfusedOptimizer`, a dynamic loss scale where fp16 runs)
    trains and checkpoints on this CPU: DeepSpeed refused fp16 here before the fallback."""
    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        deepspeed={"zeroStage": 0},
        training={"maxSteps": 2, "precision": "fp16", "checkpointEverySteps": 1},
    )
    out = tmp_path / "out"
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(280) == 0, run.log()[-3000:]
    log = run.log()
    computed = "fp16" if modeling.cpu_supports_fp16() else "bf16"
    assert f"{computed} on CPU (optimizer FP16_UnfusedOptimizer)" in log, log[-3000:]
    assert (computed == "bf16") == (modeling.CPU_FP16_FALLBACK in log)
    assert (out / "checkpoints" / "step-00000001" / "trainable_state.pt").is_file()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_qlora_on_cpu_computes_in_the_jobs_precision(tiny_model_dir: Path) -> None:
    """The 4-bit layers dequantise to bf16 on CPU as on a GPU (they computed in fp32 before)."""
    import torch
    from bitsandbytes.nn.modules import Linear4bit

    layers = [m for m in qlora_model(tiny_model_dir).modules() if isinstance(m, Linear4bit)]
    assert layers and {layer.compute_dtype for layer in layers} == {torch.bfloat16}
