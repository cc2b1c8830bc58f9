"""Ranks forked from a preloaded node launcher vs ranks started as fresh interpreters, on CPU.

Each round runs the same tiny job (builtin tiny Llama, LoRA, 2 CPU ranks, ZeRO-2) through
`ftjob run` twice, once per way of starting the ranks (FTJOB_LAUNCHER_PRELOAD=none is a GPU
node's way; unset, a CPU node forks its ranks from a launcher that imported torch, DeepSpeed and
peft once), alternating which goes first. It prints each run's wall time and the CPU time of
the whole process tree, then the medians and the ratio forked / fresh. Run on demand; nothing
here is asserted by the tests.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/rank_start.py [--rounds 3] [--steps 3]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/rank_start.py --smoke    # one round, one step

A run that fails ends the benchmark with exit status 1.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster.ports import free_port

REPO = Path(__file__).resolve().parents[1]
MODES = {"fresh": "none", "forked": None}
"""FTJOB_LAUNCHER_PRELOAD for each way of starting the ranks (None: unset, the CPU default)."""


def job(steps: int, out: Path) -> dict[str, Any]:
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "rank-start"},
        "spec": {
            "model": {"uri": "builtin://tiny-llama"},
            "dataset": {"uri": "builtin://reverse-words", "format": "messages", "maxSeqLength": 64},
            "method": {"type": "lora"},
            "training": {"maxSteps": steps, "microBatchSize": 2, "globalBatchSize": 4, "precision": "fp32"},
            "resources": {"numNodes": 2, "gpusPerNode": 0},  # 2 CPU ranks on this machine
            "deepspeed": {"zeroStage": 2, "offloadOptimizer": "none"},
            "output": {"uri": str(out)},
        },
    }


def run_once(mode: str, steps: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of ftjob run and everything under it) of one run."""
    with tempfile.TemporaryDirectory(prefix="ftjob-rank-start-") as tmp:
        root = Path(tmp)
        (root / "job.yaml").write_text(yaml.safe_dump(job(steps, root / "out")))
        env = {k: v for k, v in os.environ.items() if k != "FTJOB_LAUNCHER_PRELOAD"}
        env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "FTJOB_METRICS_PORT": "off"})
        env["PYTHONPATH"] = os.pathsep.join(str(REPO / s) for s in ("operator", "trainer_image"))
        if MODES[mode] is not None:
            env["FTJOB_LAUNCHER_PRELOAD"] = str(MODES[mode])
        cmd = [sys.executable, "-m", "finetune_operator.cli.main", "run", str(root / "job.yaml"), "--no-progress"]
        cmd += ["--master-port", str(free_port())]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        with (root / "log").open("w") as log:
            code = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        wall = time.monotonic() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if code != 0:
            print((root / "log").read_text()[-3000:], file=sys.stderr)
            raise SystemExit(f"rank_start: the {mode} run failed (exit {code})")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one round of one step")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps = 1, 1
    print(f"tiny Llama LoRA, 2 CPU ranks, ZeRO-2, {args.steps} steps, {args.rounds} rounds (ftjob run)")
    print(f"{'round':5} {'ranks':7} {'wall s':>7} {'CPU s':>7}")
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for i in range(args.rounds):
        order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
        for mode in order:
            seconds, cpu_seconds = run_once(mode, args.steps)
            results[mode].append((seconds, cpu_seconds))
            print(f"{i + 1:5} {mode:7} {seconds:7.1f} {cpu_seconds:7.1f}", flush=True)
    wall = {m: statistics.median(w for w, _ in r) for m, r in results.items()}
    cpu = {m: statistics.median(c for _, c in r) for m, r in results.items()}
    print(f"median  fresh wall {wall['fresh']:.1f} s CPU {cpu['fresh']:.1f} s; forked wall {wall['forked']:.1f} s "
          f"CPU {cpu['forked']:.1f} s")  # fmt: skip
    print(f"forked / fresh: wall {wall['forked'] / wall['fresh']:.2f}x, CPU {cpu['forked'] / cpu['fresh']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
