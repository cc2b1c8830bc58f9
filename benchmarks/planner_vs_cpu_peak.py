"""The planner's bytes per rank vs the peak resident memory of real CPU ranks, packing on and off.

Each row plans a job (2 CPU ranks, ZeRO-2, fixed micro-batch, no checkpointing) with the
operator's planner, runs it through the pod entrypoint (`ftjob train`: the node launcher
and two gloo ranks), and samples every rank's VmHWM (peak resident set) from /proc until it
exits. A packed micro-batch is full rows of maxSeqLength with the block-diagonal mask the CPU
trainer builds; unpacked rows are padded to the longest in the batch, so the plan (which sizes
full rows) is an upper bound there. Run on demand; nothing here is asserted by the tests.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_vs_cpu_peak.py [--model DIR|builtin://tiny-llama]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_vs_cpu_peak.py \
        --model builtin://smollm2-135m-instruct --micro 2 --steps 4
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_vs_cpu_peak.py --smoke   # LoRA, packed, 2 steps
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_vs_cpu_peak.py --methods lora dpo orpo full dpo-full

The preference methods (dpo, orpo: LoRA; dpo-full, orpo-full: every weight, DPO with a frozen copy
as its reference) train on `--preference-dataset` (pairs: two sequences per example, a micro-batch
of N pairs is 2N rows), unpacked: preference rows are never packed.

A run that fails, or whose ranks were never sampled, ends the benchmark with exit status 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from finetune_localcluster.ports import free_port
from finetune_operator.api.methods import MethodType, TrainingMethod

REPO = Path(__file__).resolve().parents[1]
for sub in ("operator", "trainer_image"):
    sys.path.insert(0, str(REPO / sub))
GIB = 2**30


PREFERENCE = {
    "dpo": (TrainingMethod.DPO, MethodType.LORA),
    "orpo": (TrainingMethod.ORPO, MethodType.LORA),
    "dpo-full": (TrainingMethod.DPO, MethodType.FULL),
    "orpo-full": (TrainingMethod.ORPO, MethodType.FULL),
}
"""Benchmark method name -> (method.type, method.preference.base)."""


def _method_block(method: str) -> dict[str, Any]:
    lora = {"lora": {"r": 16, "alpha": 32, "dropout": 0.0}}
    if method in PREFERENCE:
        kind, base = PREFERENCE[method]
        return {"type": kind, "preference": {"base": base}, **({} if base == MethodType.FULL else lora)}
    return {"type": method, **({} if method == MethodType.FULL else lora)}


def manifest(args: argparse.Namespace, method: str, packing: bool, out: Path) -> dict[str, Any]:
    preference = method in PREFERENCE
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "bench"},
        "spec": {
            "model": {"uri": args.model},
            "dataset": {
                "uri": args.preference_dataset if preference else args.dataset,
                "format": "preference" if preference else args.format,
                "maxSeqLength": args.seq,
                "packing": packing,
                "validationSplit": 0.02,
            },
            "method": _method_block(method),
            "training": {
                "maxSteps": args.steps,
                "microBatchSize": args.micro,
                "globalBatchSize": args.micro * 2,
                "precision": args.precision,
                "gradientCheckpointing": False,
                "checkpointEverySteps": 1000,
                "learningRate": 1e-4,
            },
            "resources": {"numNodes": 2, "gpusPerNode": 0},
            "deepspeed": {"zeroStage": 2, "offloadOptimizer": "none"},
            "output": {"uri": str(out)},
        },
    }


def _workers(root: int) -> list[int]:
    """The ranks under `root` (this run's entrypoint), not anyone else's on the machine."""
    import psutil

    found: list[tuple[int, int]] = []
    try:
        for proc in psutil.Process(root).children(recursive=True):
            try:
                if proc.name().startswith("ftjob-rank"):  # the name each rank gives itself (worker.py)
                    found.append((proc.pid, proc.ppid()))
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    ranks = {pid for pid, _ in found}
    # a rank's own forked child (a build or a worker before its exec) has the rank's name
    return [pid for pid, parent in found if parent not in ranks]


def _hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rank_peaks(proc: subprocess.Popen[Any]) -> dict[int, int]:
    """Each rank's peak resident set (VmHWM) under `proc`, sampled until it exits. `proc` must run in a
    session of its own: interrupted, this kills the whole run, which would outlive the caller."""
    peaks: dict[int, int] = {}
    try:
        while proc.poll() is None:
            for pid in _workers(proc.pid):
                value = _hwm(pid)
                if value is not None:
                    peaks[pid] = max(peaks.get(pid, 0), value)
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return peaks


def measure(args: argparse.Namespace, method: str, packing: bool) -> tuple[Any, list[int], float]:
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import choose_plan
    from finetune_operator.render.config_files import config_files

    with tempfile.TemporaryDirectory(prefix="ftjob-bench-") as tmp:
        root = Path(tmp)
        job = FineTuneJob.from_manifest(manifest(args, method, packing, root / "out"))
        plan = choose_plan(job.spec)
        config = root / "config"
        config.mkdir()
        for name, content in config_files(job, plan, "localhost slots=2\n").items():
            (config / name).write_text(content)
        env = dict(os.environ)
        env.update(
            {
                "FTJOB_OUTPUT_DIR": str(root / "out"),
                "FTJOB_TERMINATION_LOG": str(root / "termination"),
                "FTJOB_METRICS_PORT": "off",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "NODE_RANK": "0",
                "DS_ACCELERATOR": "cpu",
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.pathsep.join(str(REPO / s) for s in ("operator", "trainer_image")),
            }
        )
        began = time.monotonic()
        log = (root / "log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "finetune_operator.cli.main", "train", "--config", str(config)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            peaks = rank_peaks(proc)
        finally:
            log.close()
        if proc.returncode != 0:
            print((root / "log").read_text()[-3000:], file=sys.stderr)
            raise SystemExit(f"planner_vs_cpu_peak: {method} packing={packing}: the run failed ({proc.returncode})")
        if not peaks:
            raise SystemExit(f"planner_vs_cpu_peak: {method} packing={packing}: no rank was ever sampled")
        return plan, sorted(peaks.values()), time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin://tiny-llama", help="builtin://tiny-llama or a local model folder")
    parser.add_argument("--dataset", default="builtin://reverse-words")
    parser.add_argument("--format", default="messages")
    parser.add_argument("--preference-dataset", default="builtin://secret-code-preference")
    parser.add_argument("--seq", type=int, default=512, help="maxSeqLength")
    parser.add_argument("--micro", type=int, default=8, help="micro-batch per rank")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--methods", nargs="+", default=["lora", "full"])
    parser.add_argument(
        "--precision", default="fp32", help="training.precision (CPU ranks keep it; fp16 falls back to bf16)"
    )
    parser.add_argument("--smoke", action="store_true", help="LoRA, packing on, seq 64, micro-batch 2, 2 steps")
    args = parser.parse_args(argv)
    packings: tuple[bool, ...] = (False, True)
    if args.smoke:
        args.methods, args.seq, args.micro, args.steps, packings = ["lora"], 64, 2, 2, (True,)
    print(
        f"model {args.model}, 2 CPU ranks, ZeRO-2, precision {args.precision}, micro-batch {args.micro}, "
        f"maxSeqLength {args.seq}"
    )
    print(f"{'method':8} {'packing':8} {'plan GiB':>9} {'act+logits':>11} {'measured GiB (per rank)':>24} {'ratio':>6}")
    for method in args.methods:
        for packing in (False,) if method in PREFERENCE else packings:
            plan, peaks, seconds = measure(args, method, packing)
            b = plan.breakdown
            act = (b.activations + b.logits) / GIB
            measured = max(peaks) / GIB
            ranks = ", ".join(f"{p / GIB:.2f}" for p in peaks)
            ratio = measured / (plan.per_gpu_bytes / GIB)
            print(
                f"{method:8} {'on' if packing else 'off':8} {plan.per_gpu_bytes / GIB:9.2f} {act:11.2f} "
                f"{ranks:>24} {ratio:6.2f}   ({seconds:.0f} s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
