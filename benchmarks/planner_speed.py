"""Benchmark (d): how long planning takes, analytical (70B) and traced (7B), on this CPU.

    .venv/bin/python benchmarks/planner_speed.py [--skip-traced]
    .venv/bin/python benchmarks/planner_speed.py --smoke   # one analytical case twice, traced tiny-llama

A plan with no candidate measured nothing: the run stops there with exit status 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

if TYPE_CHECKING:
    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_operator.plan.search.planner import PlanResult

ANALYTICAL = [("llama-3.1-70b", "full", 4, 4096), ("llama-3.1-70b", "lora", 1, 4096), ("qwen2.5-72b", "qlora", 1, 8192)]
TRACED = [("llama-2-7b", "lora"), ("llama-2-7b", "full")]


def job(model: str, method: str, nodes: int, seq: int) -> FineTuneJobSpec:
    from finetune_operator.api.spec import FineTuneJobSpec

    return FineTuneJobSpec.from_wire(
        {
            "model": {"uri": "org/model", "architecture": model},
            "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": seq},
            "method": {"type": method},
            "resources": {"numNodes": nodes, "gpusPerNode": 8},
            "training": {"globalBatchSize": 256},
            "output": {"uri": "/out"},
        }
    )


def planned(spec: FineTuneJobSpec, traced: bool) -> PlanResult:
    from finetune_operator.plan import plan_job

    result = plan_job(spec, traced=traced, require_fit=False)
    if not result.candidates:
        raise SystemExit(f"planner_speed: no candidate for {spec.model.architecture} {spec.method.type}: nothing timed")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-traced", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one analytical case twice and a traced tiny-llama")
    args = parser.parse_args(argv)
    analytical, repeats, traced = (
        (ANALYTICAL[:1], 2, [("tiny-llama", "lora")]) if args.smoke else (ANALYTICAL, 20, TRACED)
    )
    print(f"{'job':44} {'mode':10} {'candidates':>10} {'median s':>9} {'max s':>7}")
    for model, method, nodes, seq in analytical:
        spec = job(model, method, nodes, seq)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            result = planned(spec, traced=False)
            times.append(time.perf_counter() - started)
        label = f"{model} {method} {nodes * 8} GPUs seq {seq}"
        print(
            f"{label:44} {'analytical':10} {len(result.candidates):10} "
            f"{statistics.median(times):9.4f} {max(times):7.4f}"
        )
    if not args.skip_traced:
        seq = 256 if args.smoke else 2048
        for model, method in traced:
            spec = job(model, method, 1, seq)
            started = time.perf_counter()
            result = planned(spec, traced=True)
            elapsed = time.perf_counter() - started
            label = f"{model} {method} 8 GPUs seq {seq}"
            print(f"{label:44} {'traced':10} {len(result.candidates):10} {elapsed:9.2f} {elapsed:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
