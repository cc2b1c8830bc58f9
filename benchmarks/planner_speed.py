"""Benchmark (d): how long planning takes, analytical (70B) and traced (7B), on this CPU.

.venv/bin/python benchmarks/planner_speed.py [--skip-traced]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))


def job(model: str, method: str, nodes: int, seq: int) -> object:
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-traced", action="store_true")
    args = parser.parse_args()
    from finetune_operator.plan import plan_job

    print(f"{'job':44} {'mode':10} {'candidates':>10} {'median s':>9} {'max s':>7}")
    cases = [("llama-3.1-70b", "full", 4, 4096), ("llama-3.1-70b", "lora", 1, 4096), ("qwen2.5-72b", "qlora", 1, 8192)]
    for model, method, nodes, seq in cases:
        spec = job(model, method, nodes, seq)
        times = []
        for _ in range(20):
            started = time.perf_counter()
            result = plan_job(spec, require_fit=False)  # type: ignore[arg-type]
            times.append(time.perf_counter() - started)
        label = f"{model} {method} {nodes * 8} GPUs seq {seq}"
        print(
            f"{label:44} {'analytical':10} {len(result.candidates):10} "
            f"{statistics.median(times):9.4f} {max(times):7.4f}"
        )
    if not args.skip_traced:
        for model, method in (("llama-2-7b", "lora"), ("llama-2-7b", "full")):
            spec = job(model, method, 1, 2048)
            started = time.perf_counter()
            result = plan_job(spec, traced=True, require_fit=False)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - started
            label = f"{model} {method} 8 GPUs seq 2048"
            print(f"{label:44} {'traced':10} {len(result.candidates):10} {elapsed:9.2f} {elapsed:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
