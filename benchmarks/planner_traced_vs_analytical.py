"""Benchmark (c): traced activation peak vs the analytical activation + logits terms.

Each catalogue family is cut to a few layers (the per-layer terms are what is being
checked; the full depth only multiplies them), traced with fake tensors at the given
sequence length, and compared with `activations.py`.

    .venv/bin/python benchmarks/planner_traced_vs_analytical.py [--seq 1024] [--layers 4]
    .venv/bin/python benchmarks/planner_traced_vs_analytical.py --smoke   # tiny-llama, seq 128, 2 layers
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

MODELS = [
    "tiny-llama",
    "llama-2-7b",
    "llama-3.1-8b",
    "mistral-7b",
    "qwen2.5-7b",
    "gemma-2-9b",
    "phi-3-mini",
    "mixtral-8x7b",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "llama-3.2-1b",
    "gemma-3-1b",
    "gemma-3-4b",
    "phi-4",
    "olmo-2-7b",
    "granite-3.3-8b",
    "gpt-oss-20b",
]


def cut_to_layers(config: dict[str, Any], layers: int) -> tuple[dict[str, Any], int]:
    """The config with at most `layers` decoder layers (an image-text model's in `text_config`), and how many."""
    if "text_config" in config:
        text, kept = cut_to_layers(config["text_config"], layers)
        return config | {"text_config": text}, kept
    kept = min(layers, int(config["num_hidden_layers"]))
    cut = config | {"num_hidden_layers": kept}
    if isinstance(config.get("layer_types"), list):
        cut["layer_types"] = config["layer_types"][:kept]
    return cut, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--smoke", action="store_true", help="tiny-llama at seq 128 with 2 layers")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.seq, args.layers = ["tiny-llama"], 128, 2
    if not args.models:
        parser.error("--models: name at least one catalogue model")

    from finetune_operator.api.methods import MethodType
    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_operator.plan.search.activations import activation_bytes
    from finetune_operator.plan.search.traced import trace_training_step
    from finetune_operator.plan.sources.model_source import catalogue_entry
    from finetune_operator.plan.workload import workload_from_spec

    mib = 2**20
    print(f"seq {args.seq}, micro-batch 1, {args.layers} layers per model, bf16, LoRA r=16 all-linear dropout 0.05")
    print(f"{'model':14} {'method':6} {'ckpt':5} {'traced MiB':>10} {'analytical':>10} {'diff':>7} {'trace s':>8}")
    worst = 0.0
    for model in args.models:
        config, layers = cut_to_layers(catalogue_entry(model).config, args.layers)
        for method in (MethodType.LORA, MethodType.FULL):
            spec = FineTuneJobSpec.from_wire(
                {
                    "model": {"uri": "org/model", "architecture": model},
                    "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": args.seq},
                    "method": {"type": method},
                    "output": {"uri": "/out"},
                }
            )
            w = workload_from_spec(spec)
            w = dataclasses.replace(w, shape=dataclasses.replace(w.shape, num_layers=layers))
            for ckpt in (False, True):
                traced = trace_training_step(
                    config,
                    1,
                    args.seq,
                    lora_r=None if method == MethodType.FULL else 16,
                    lora_dropout=w.lora_dropout,
                    gradient_checkpointing=ckpt,
                )
                ours = activation_bytes(w, 1, ckpt)
                total = ours.activations + ours.logits
                diff = (total - traced.peak_bytes) / traced.peak_bytes * 100
                worst = max(worst, abs(diff))
                print(
                    f"{model:14} {method:6} {ckpt!s:5} {traced.peak_bytes / mib:10.1f} {total / mib:10.1f} "
                    f"{diff:+6.1f}% {traced.seconds:8.2f}",
                    flush=True,
                )
    print(f"largest disagreement: {worst:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
