"""Benchmark (e): predicted per-GPU bytes vs `torch.cuda.max_memory_allocated()` on a real GPU.

One process, one GPU, real DeepSpeed (NCCL, world size 1), random-init Llama-shaped
models generated here, trained with the trainer's own loss (`finetune_kernels/chunked_loss.py`). For each
configuration it runs three optimizer steps, takes the
allocator's peak and prints it beside the planner's per-GPU bytes without the runtime
overhead term (the CUDA context and library workspaces are not allocator memory).
Target: within 10 %.

    .venv/bin/python benchmarks/planner_gpu/run_gpu_ground_truth.py [--quick]
    .venv/bin/python benchmarks/planner_gpu/run_gpu_ground_truth.py --smoke   # a tiny shape, GPU or CPU

`--smoke` runs two tiny configurations (LoRA at ZeRO-0, full at ZeRO-3 with checkpointing)
through the same code; without a GPU they run on the CPU in fp32 (gloo) and their rows say
that no allocator peak was measured. A configuration that fails is reported in its row and
makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))

SHAPES: dict[str, dict[str, int]] = {
    "llama-tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
    "llama-150m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12},
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 16},
    "llama-3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 26, "num_attention_heads": 24},
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    },
}
TORCHTUNE_LORA = {
    "r": 8,
    "dropout": 0.0,
    "targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
"""torchtune's llama3_1/8B_lora_single_device, published at 16.2 GiB reserved (batch 2 × 2048, checkpointing):
see benchmarks/planner_vs_published.py."""
CONFIGS: list[dict[str, Any]] = [
    {"shape": "llama-1b", "method": "lora", "stage": 0, "ckpt": False, "micro": 4, "seq": 1024},
    {"shape": "llama-1b", "method": "lora", "stage": 0, "ckpt": True, "micro": 8, "seq": 2048},
    {"shape": "llama-1b", "method": "full", "stage": 2, "ckpt": True, "micro": 2, "seq": 2048},
    {"shape": "llama-1b", "method": "full", "stage": 3, "ckpt": False, "micro": 2, "seq": 1024},
    {"shape": "llama-3b", "method": "lora", "stage": 3, "ckpt": True, "micro": 4, "seq": 4096},
    {"shape": "llama-3b", "method": "full", "stage": 2, "ckpt": True, "micro": 1, "seq": 2048, "offload": "cpu"},
    {"shape": "llama-150m", "method": "full", "stage": 0, "ckpt": False, "micro": 8, "seq": 1024},
    {
        "shape": "llama-3.1-8b",
        "method": "lora",
        "stage": 0,
        "ckpt": True,
        "micro": 2,
        "seq": 2048,
        "lora": TORCHTUNE_LORA,
    },
]


SMOKE: list[dict[str, Any]] = [
    {"shape": "llama-tiny", "method": "lora", "stage": 0, "ckpt": False, "micro": 2, "seq": 64},
    {"shape": "llama-tiny", "method": "full", "stage": 3, "ckpt": True, "micro": 2, "seq": 64},
]


def model_config(shape: str) -> dict[str, Any]:
    dims = SHAPES[shape]
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32000,
        "num_key_value_heads": dims["num_attention_heads"],
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        **dims,
    }


def spec_for(config_dir: str, case: dict[str, Any]) -> Any:
    from finetune_operator.api.methods import MethodType
    from finetune_operator.api.spec import FineTuneJobSpec

    return FineTuneJobSpec.from_wire(
        {
            "model": {"uri": config_dir},
            "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": case["seq"]},
            "method": (
                {"type": "full"} if case["method"] == MethodType.FULL else {"type": case["method"], "lora": _lora(case)}
            ),
            "training": {
                "microBatchSize": case["micro"],
                "globalBatchSize": case["micro"],
                "gradientCheckpointing": "true" if case["ckpt"] else "false",
            },
            "resources": {"numNodes": 1, "gpusPerNode": 1, "gpuMemory": "141Gi"},
            "deepspeed": {
                "zeroStage": case["stage"],
                "offloadOptimizer": case.get("offload", "none"),
                "offloadParams": "none",
            },
            "output": {"uri": "/tmp/out"},
        }
    )


def _lora(case: dict[str, Any]) -> dict[str, Any]:
    lora = case.get("lora", {"r": 16, "dropout": 0.05, "targets": ["all-linear"]})
    return {"r": lora["r"], "alpha": 2 * lora["r"], "dropout": lora["dropout"], "targetModules": lora["targets"]}


def run_case(case: dict[str, Any], workdir: Path, on_gpu: bool = True) -> tuple[int, int | None]:
    """(predicted, measured) bytes; measured is None on the CPU, which has no allocator peak."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from finetune_kernels.chunked_loss import causal_lm_loss, output_head
    from finetune_operator.api.methods import MethodType
    from finetune_operator.plan import plan_job
    from finetune_operator.plan.counting.meta_count import build_config
    from finetune_operator.render.deepspeed_config import deepspeed_config
    from finetune_trainer.model.modeling import compute_settings, effective_deepspeed_config

    config_dir = workdir / case["shape"]
    config_dir.mkdir(exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps(model_config(case["shape"])))
    spec = spec_for(str(config_dir), case)
    result = plan_job(spec, require_fit=False)
    assert result.chosen is not None or result.candidates
    candidate = result.chosen or result.candidates[0]
    plan = result.to_status(candidate)
    predicted = candidate.per_gpu_bytes - candidate.memory.breakdown["overhead"]

    ds_config = deepspeed_config(spec, plan)
    if not on_gpu:  # fp32: what the trainer runs on a CPU
        ds_config = effective_deepspeed_config(ds_config, compute_settings(spec, on_gpu=False))
    # On a GPU, DeepSpeed's fused Adam (what a run uses); on the CPU, torch's (the fused one is compiled first)
    ds_config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4, **({} if on_gpu else {"torch_adam": True})}}
    dtype = torch.bfloat16 if on_gpu else torch.float32
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with deepspeed.zero.Init(enabled=case["stage"] == 3, config_dict_or_path=ds_config):
        config = build_config(model_config(case["shape"]))
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    if case["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case["method"] != MethodType.FULL:
        import peft

        lora = _lora(case)
        targets = lora["targetModules"]
        model = peft.get_peft_model(
            model,
            peft.LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora["dropout"],
                target_modules="all-linear" if targets == ["all-linear"] else targets,
            ),
        )
    head = output_head(model)  # the trainer's loss: chunked, never the full logits
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
    vocab = model_config(case["shape"])["vocab_size"]
    tokens = torch.randint(0, vocab, (case["micro"], case["seq"]), device=engine.device)
    inputs = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens}
    for _ in range(3):
        loss = causal_lm_loss(engine, head, inputs) if head is not None else engine(**inputs).loss
        engine.backward(loss)
        engine.step()
    measured = None
    if on_gpu:
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated()
    engine.destroy()
    del engine, model
    if on_gpu:
        torch.cuda.empty_cache()
    return predicted, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the first three configurations")
    parser.add_argument("--smoke", action="store_true", help="two tiny configurations, on the CPU without a GPU")
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        parser.error("no GPU here: this benchmark measures the CUDA allocator (--smoke runs its code on the CPU)")
    if not on_gpu:
        os.environ["DS_ACCELERATOR"] = "cpu"
    from finetune_trainer.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()  # without its CPU shm op, as the trainer's ranks
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    device = f"GPU: {torch.cuda.get_device_name()}" if on_gpu else "CPU (smoke: no allocator peak)"
    print(f"{device}, torch {torch.__version__}, deepspeed {deepspeed.__version__}")
    print(f"{'configuration':58} {'predicted GiB':>13} {'measured GiB':>12} {'diff':>7} {'s':>6}")
    cases = SMOKE if args.smoke else CONFIGS[:3] if args.quick else CONFIGS
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            started = time.perf_counter()
            label = (
                f"{case['shape']} {case['method']} ZeRO-{case['stage']} opt={case.get('offload', 'none')} "
                f"mb={case['micro']} seq={case['seq']}{' ckpt' if case['ckpt'] else ''}"
            )
            try:
                predicted, measured = run_case(case, Path(tmp), on_gpu)
            except Exception as exc:  # report and continue: one failing configuration must not hide the others
                print(f"{label:58} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                failed += 1
                continue
            seconds = time.perf_counter() - started
            if measured is None:
                print(f"{label:58} {predicted / 2**30:13.2f} {'CPU: -':>12} {'-':>7} {seconds:6.1f}", flush=True)
                continue
            diff = (predicted - measured) / measured * 100
            print(
                f"{label:58} {predicted / 2**30:13.2f} {measured / 2**30:12.2f} {diff:+6.1f}% {seconds:6.1f}",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
