"""Benchmark (a): the planner's full fine-tuning model states vs DeepSpeed's own estimators.

For several catalogue models, world sizes and offload settings, prints DeepSpeed's
`estimate_zero2/3_model_states_mem_needs` (what the `_all_cold` helpers print) beside
the planner's model-state bytes per GPU (plus, at ZeRO-3, the largest layer gathered
with its gradient, which DeepSpeed folds into the same number). Host columns are shown
for information: DeepSpeed's are deliberately generous (a 1.5 buffer factor).

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_vs_deepspeed.py
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_vs_deepspeed.py --smoke   # one model, 8 GPUs
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

MODELS = ["phi-3-mini", "llama-2-7b", "llama-3.1-8b", "qwen2.5-14b", "mixtral-8x7b", "llama-3.1-70b"]
LAYOUTS = [(1, 8), (4, 8), (16, 8)]
CASES = [(2, "none", "none"), (2, "cpu", "none"), (3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="the first model on 8 GPUs, every strategy")
    args = parser.parse_args(argv)
    models, layouts = (MODELS[:1], LAYOUTS[:1]) if args.smoke else (MODELS, LAYOUTS)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_operator.api.strategy import Strategy
    from finetune_operator.plan.search.memory import estimate_memory
    from finetune_operator.plan.workload import workload_from_spec

    gib = 2**30
    print(
        f"{'model':14} {'GPUs':>5} {'strategy':22} {'DS GPU GiB':>10} {'plan GiB':>9} {'diff':>7} "
        f"{'DS host/node':>12} {'plan host/node':>14}"
    )
    worst = 0.0
    for model in models:
        for nodes, gpus in layouts:
            spec = FineTuneJobSpec.from_wire(
                {
                    "model": {"uri": "org/model", "architecture": model},
                    "dataset": {"uri": "builtin://reverse-words"},
                    "method": {"type": "full"},
                    "resources": {"numNodes": nodes, "gpusPerNode": gpus},
                    "output": {"uri": "/out"},
                }
            )
            w = workload_from_spec(spec)
            for stage, optimizer, params in CASES:
                estimate = estimate_memory(
                    w,
                    Strategy(
                        zero_stage=stage,
                        offload_optimizer=optimizer,
                        offload_params=params,
                        micro_batch_size=1,
                        gradient_accumulation_steps=1,
                    ),
                )
                ours = estimate.model_state_bytes
                if stage == 2:
                    ds_cpu, ds_gpu = estimate_zero2_model_states_mem_needs(
                        w.counts.total, gpus, nodes, optimizer != "none"
                    )
                else:
                    ds_cpu, ds_gpu, _ = estimate_zero3_model_states_mem_needs(
                        w.counts.total, w.counts.largest_layer, gpus, nodes, optimizer != "none", params != "none"
                    )
                    ours += 2 * w.param_bytes * w.counts.largest_layer
                diff = (ours - ds_gpu) / ds_gpu * 100
                worst = max(worst, abs(diff))
                label = f"ZeRO-{stage} opt={optimizer} par={params}"
                host = estimate.host_bytes_per_node - w.ranks_per_node * 3 * gib
                print(
                    f"{model:14} {nodes * gpus:5} {label:22} {ds_gpu / gib:10.2f} {ours / gib:9.2f} {diff:+6.2f}% "
                    f"{ds_cpu / gib:12.1f} {host / gib:14.1f}"
                )
    print(f"largest GPU-side disagreement: {worst:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
