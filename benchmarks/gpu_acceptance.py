"""GPU acceptance: the planner, the trainer's model paths and its OOM reporting on one real GPU.

Run it whenever a GPU is at hand (one card, under 8 minutes on an H200); `--dry-run` plans
everything and runs a tiny version of every path on the CPU (CI runs it, see
tests/unit/test_gpu_acceptance_dry_run.py). It extends benchmarks/planner_gpu/:

- (a) the planner's per-GPU bytes (without the runtime-overhead term: the CUDA context is not
  allocator memory) against `torch.cuda.max_memory_allocated()`, random-init Llama-shaped
  models from config (no download): LoRA, QLoRA and full, ZeRO 0-3 at world size 1,
  checkpointing on and off, two sequence lengths;
- (b) 24, 40 and 80 GiB cards emulated with `torch.cuda.set_per_process_memory_fraction`: the
  planner picks a strategy for an 8B-shaped model, 5 steps run with it; out-of-memory errors
  (target 0) and the peak against the card;
- (c) QLoRA through bitsandbytes and the bf16 path, through the trainer's own `load_model`;
- (d) a forced out-of-memory error, reported with the trainer's `OutOfMemory` root cause.

    .venv/bin/python benchmarks/gpu_acceptance.py            # on a GPU machine
    .venv/bin/python benchmarks/gpu_acceptance.py --dry-run  # CPU: plans + tiny runs

Each table row is one line `section | configuration | planned GiB | measured GiB | ratio | note`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in ("operator", "trainer_image", "benchmarks/planner_gpu"):
    sys.path.insert(0, str(ROOT / extra))

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
GPU_SHAPE = "llama-1b"
CARDS_GIB = (24, 40, 80)
EIGHT_B = "meta-llama/Llama-3.1-8B"
GIB = 2**30


@dataclass
class Row:
    section: str
    label: str
    planned: float | None
    measured: float | None
    note: str = ""

    def line(self) -> str:
        planned = f"{self.planned / GIB:.2f}" if self.planned is not None else "-"
        measured = f"{self.measured / GIB:.2f}" if self.measured is not None else "-"
        ratio = f"{self.measured / self.planned:.2f}" if self.planned and self.measured else "-"
        return f"{self.section} | {self.label} | {planned} | {measured} | {ratio} | {self.note}"


def llama_config(dims: dict[str, int], vocab: int) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "num_key_value_heads": dims["num_attention_heads"],
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        **dims,
    }


def job_spec(
    model_uri: str, method: str, stage: int | str, ckpt: bool, seq: int, micro: int | str, gpu_gib: int
) -> Any:
    from finetune_operator.api.spec import FineTuneJobSpec

    auto = stage == "auto"
    return FineTuneJobSpec.from_wire(
        {
            "model": {"uri": model_uri},
            "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": seq},
            "method": {"type": method},
            "training": {
                "microBatchSize": micro,
                "globalBatchSize": micro if isinstance(micro, int) else 8,
                "gradientCheckpointing": "auto" if auto else ("true" if ckpt else "false"),
                "precision": "bf16",
            },
            "resources": {"numNodes": 1, "gpusPerNode": 1, "gpuMemory": f"{gpu_gib}Gi"},
            "deepspeed": {
                "zeroStage": stage,
                **({} if auto else {"offloadOptimizer": "none", "offloadParams": "none"}),
            },
            "output": {"uri": "/tmp/out"},
        }
    )


def planned_bytes(spec: Any) -> tuple[Any, int]:
    """The status plan and its per-GPU bytes without the runtime overhead (what the allocator sees)."""
    from finetune_operator.plan import plan_job

    result = plan_job(spec, require_fit=False)
    candidate = result.chosen or result.candidates[0]
    return result.to_status(candidate), int(candidate.per_gpu_bytes - candidate.memory.breakdown["overhead"])


def train(model_dir: Path, spec: Any, plan: Any, steps: int, on_gpu: bool) -> int | None:
    """`steps` optimizer steps through the trainer's own load_model and a DeepSpeed engine; the peak or None (CPU)."""
    import deepspeed
    import torch

    from finetune_operator.render.deepspeed_config import deepspeed_config
    from finetune_trainer import modeling

    compute = modeling.compute_settings(spec, on_gpu)
    ds_config = modeling.effective_deepspeed_config(deepspeed_config(spec, plan), compute)
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = modeling.load_model(spec, plan, str(model_dir), compute, ds_config)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    if on_gpu and plan.offload_optimizer != "none":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        optimizer = DeepSpeedCPUAdam(params, lr=1e-4)
    ds_config.pop("optimizer", None)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    vocab = int(model.config.vocab_size)
    tokens = torch.randint(0, vocab, (plan.micro_batch_size, spec.dataset.max_seq_length), device=engine.device)
    for _ in range(steps * plan.gradient_accumulation_steps):
        loss = engine(input_ids=tokens, attention_mask=torch.ones_like(tokens), labels=tokens).loss
        engine.backward(loss)
        engine.step()
    peak = None
    if on_gpu:
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated())
    engine.destroy()
    del engine, model, optimizer
    if on_gpu:
        torch.cuda.empty_cache()
    return peak


def save_random_model(config: dict[str, Any], folder: Path, on_gpu: bool = False) -> Path:
    """A random-init model saved like any local model (the trainer's loader, bitsandbytes included, reads it).

    On a GPU it is initialised there (an 8B model initialised on the host takes minutes).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from finetune_operator.plan.meta_count import build_config

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(build_config(config), dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    if on_gpu:
        torch.cuda.empty_cache()
    return folder


def section_a(work: Path, on_gpu: bool, rows: list[Row]) -> None:
    from run_gpu_ground_truth import SHAPES

    dims = SHAPES[GPU_SHAPE] if on_gpu else TINY
    config = llama_config(dims, 32000 if on_gpu else 512)
    folder = save_random_model(config, work / "a", on_gpu)
    seqs = (512, 2048) if on_gpu else (32, 64)
    for method in ("lora", "qlora", "full"):
        for stage in (0, 1, 2, 3):
            for ckpt in (False, True):
                for seq in seqs:
                    label = (
                        f"{GPU_SHAPE if on_gpu else 'tiny'} {method} ZeRO-{stage}{' ckpt' if ckpt else ''} seq={seq}"
                    )
                    spec = job_spec(str(folder), method, stage, ckpt, seq, 2, 141)
                    plan, planned = planned_bytes(spec)
                    if not on_gpu and not (ckpt and seq == seqs[0]):  # CPU: one tiny run per method and stage
                        rows.append(Row("a", label, planned, None, "planned only (dry run)"))
                        continue
                    rows.append(
                        run_row("a", label, planned, partial(train, folder, spec, plan, 3 if on_gpu else 1, on_gpu))
                    )


def run_row(section: str, label: str, planned: int | None, body: Any, limit: int | None = None) -> Row:
    from finetune_trainer.outcome import OUT_OF_MEMORY, classify

    started = time.perf_counter()
    try:
        peak = body()
    except Exception as exc:  # one failing configuration must not hide the others
        reason = classify(exc)
        note = f"{'OOM' if reason == OUT_OF_MEMORY else 'failed'}: {type(exc).__name__}: {str(exc)[:120]}"
        return Row(section, label, planned, None, note)
    note = f"ok {time.perf_counter() - started:.0f}s"
    if limit is not None and peak is not None:
        note += f", peak {peak / limit:.0%} of the card"
    return Row(section, label, planned, peak, note)


def section_b(work: Path, on_gpu: bool, rows: list[Row]) -> None:
    import torch

    from finetune_operator.plan.model_source import catalogue_entry

    eight_b = catalogue_entry("llama-3.1-8b").config
    for gib in CARDS_GIB:
        spec = job_spec(EIGHT_B, "lora", "auto", True, 2048, "auto", gib)
        plan, planned = planned_bytes(spec)
        label = (
            f"8B lora on {gib} GiB: ZeRO-{plan.zero_stage} opt={plan.offload_optimizer} par={plan.offload_params} "
            f"mb={plan.micro_batch_size}{' ckpt' if plan.gradient_checkpointing else ''}"
        )
        if not on_gpu:
            tiny = save_random_model(llama_config(TINY, 512), work / "b")
            tiny_spec = job_spec(str(tiny), "lora", plan.zero_stage, plan.gradient_checkpointing, 64, 1, gib)
            tiny_plan, _ = planned_bytes(tiny_spec)
            rows.append(
                run_row(
                    "b", label + " (tiny model on CPU)", planned, partial(train, tiny, tiny_spec, tiny_plan, 1, False)
                )
            )
            continue
        limit = gib * GIB
        torch.cuda.set_per_process_memory_fraction(limit / torch.cuda.get_device_properties(0).total_memory)
        folder = save_random_model(eight_b, work / "8b", on_gpu=True)
        model_spec = job_spec(str(folder), "lora", "auto", True, 2048, "auto", gib)
        rows.append(run_row("b", label, planned, partial(train, folder, model_spec, plan, 5, True), limit))
        torch.cuda.set_per_process_memory_fraction(1.0)


def section_c(work: Path, on_gpu: bool, rows: list[Row]) -> None:
    from run_gpu_ground_truth import SHAPES

    config = llama_config(SHAPES[GPU_SHAPE] if on_gpu else TINY, 32000 if on_gpu else 512)
    folder = save_random_model(config, work / "a", on_gpu)
    seq = 1024 if on_gpu else 64
    for method in ("qlora", "lora"):
        spec = job_spec(str(folder), method, 0, True, seq, 2, 141)
        plan, planned = planned_bytes(spec)
        what = "QLoRA nf4 through bitsandbytes" if method == "qlora" else "LoRA bf16"
        device = "CUDA bf16" if on_gpu else "CPU fp32 (dry run)"
        rows.append(
            run_row("c", f"{what}, {device}", planned, partial(train, folder, spec, plan, 3 if on_gpu else 1, on_gpu))
        )


def section_d(work: Path, on_gpu: bool, rows: list[Row]) -> None:
    import torch

    from finetune_trainer.outcome import failure_line

    if on_gpu:
        from run_gpu_ground_truth import SHAPES

        folder = save_random_model(llama_config(SHAPES[GPU_SHAPE], 32000), work / "a", True)
        spec = job_spec(str(folder), "full", 0, False, 2048, 8, 141)
        plan, planned = planned_bytes(spec)
        torch.cuda.set_per_process_memory_fraction(2 * GIB / torch.cuda.get_device_properties(0).total_memory)
        try:
            train(folder, spec, plan, 1, True)
            line = "no error: the forced OOM did not happen"
        except Exception as exc:
            line = failure_line(exc, 0)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        rows.append(Row("d", "full fine-tune of 1B on a 2 GiB card", planned, None, line))
        return
    try:  # no allocator limit on CPU: the error the CUDA allocator raises, raised by hand
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated in the dry run)")
    except torch.OutOfMemoryError as exc:
        rows.append(Row("d", "forced OOM (simulated on CPU)", None, None, failure_line(exc, 0)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="plan everything, run tiny versions on the CPU")
    parser.add_argument("--sections", default="abcd", help="which sections to run (default abcd)")
    parser.add_argument("--smoke", action="store_true", help="the same as --dry-run (the benchmarks' common flag)")
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or args.smoke
    if args.dry_run:
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import deepspeed
    import torch

    on_gpu = torch.cuda.is_available() and not args.dry_run
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    device = torch.cuda.get_device_name() if on_gpu else "CPU (dry run)"
    print(f"device: {device}, torch {torch.__version__}, deepspeed {deepspeed.__version__}", flush=True)
    print("section | configuration | planned GiB | measured GiB | ratio | note", flush=True)
    started = time.perf_counter()
    sections = {"a": section_a, "b": section_b, "c": section_c, "d": section_d}
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.sections:
            rows: list[Row] = []
            sections[key](Path(tmp), on_gpu, rows)
            for row in rows:
                print(row.line(), flush=True)
    print(json.dumps({"seconds": round(time.perf_counter() - started, 1), "gpu": on_gpu}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
