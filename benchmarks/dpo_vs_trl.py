"""DPO: `ftjob run` against TRL's DPOTrainer, useful tokens per second and peak memory side by side.

Run on demand (never asserted):

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/dpo_vs_trl.py [--steps 30] [--smollm2] [--smoke]

Both sides train the same model (the built-in tiny Llama, or with `--smollm2` SmolLM2-135M-Instruct)
on the same preference pairs (the built-in secret-code pairs in TRL's conversational form), with
the same LoRA (r=16, all linear layers), beta, learning rate, DeepSpeed config (ZeRO-2, as the
operator renders it, adjusted for CPU), 2 CPU ranks, pairs per micro-batch and steps; the
reference is the base with the adapter off on both. Useful tokens are the non-padding tokens of
the chosen and rejected rows (prompts included); time is training time only (ours: the sum of
step durations; TRL: its train_runtime). Peak memory is each rank's peak resident set (ours:
VmHWM sampled from /proc; TRL: the rank's own getrusage). A failed run ends with exit status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster.ports import free_port

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
PYTHON = sys.executable
GIB = 2**30


def _job(model: str, data: Path, steps: int, micro: int, max_len: int, beta: float, lr: float) -> dict[str, Any]:
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "dpo-bench"},
        "spec": {
            "model": {"uri": model},
            "dataset": {"uri": str(data), "format": "preference", "maxSeqLength": max_len, "validationSplit": 0.0},
            "method": {
                "type": "dpo",
                "preference": {"beta": beta},
                "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
            },
            "training": {
                "maxSteps": steps,
                "microBatchSize": micro,
                "globalBatchSize": 2 * micro,
                "learningRate": lr,
                "warmupRatio": 0.05,
                "precision": "fp32",
                "checkpointEverySteps": 1_000_000,
            },
            "resources": {"numNodes": 2, "gpusPerNode": 0},
            "deepspeed": {"zeroStage": 2},
            "output": {"uri": "/tmp/unused"},
        },
    }


def _env() -> dict[str, str]:
    from benchmarks.trainer_vs_trl import _env as sft_env

    return sft_env()


def run_ours(work: Path, job: dict[str, Any]) -> dict[str, float]:
    from benchmarks.planner_vs_cpu_peak import rank_peaks

    path, out = work / "job.yaml", work / "out-ours"
    path.write_text(yaml.safe_dump(job))
    cmd = [PYTHON, "-m", "finetune_operator.cli.main", "run", str(path), "--output", str(out), "--no-progress"]
    proc = subprocess.Popen(
        [*cmd, "--master-port", str(free_port())], env=_env(), stdout=subprocess.DEVNULL, start_new_session=True
    )
    peaks = rank_peaks(proc)
    if proc.returncode != 0:
        raise SystemExit(f"dpo_vs_trl: ftjob run failed ({proc.returncode})")
    entries = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [s for s in entries if "loss" in s]
    seconds = sum(s["seconds"] for s in steps)
    return {
        "tokens": steps[-1]["tokens"],
        "seconds": seconds,
        "tokens_per_s": steps[-1]["tokens"] / seconds,
        "mean_loss": sum(s["loss"] for s in steps) / len(steps),
        "accuracy": steps[-1]["preference_accuracy"],
        "peak_gib": max(peaks.values(), default=0) / GIB,
    }


def run_trl(work: Path, model: str, data: Path, job: dict[str, Any]) -> dict[str, float]:
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import choose_plan
    from finetune_operator.render.config_files import config_files
    from finetune_trainer.model.modeling import compute_settings, effective_deepspeed_config

    parsed = FineTuneJob.from_manifest(job)
    rendered = json.loads(config_files(parsed, choose_plan(parsed.spec))["deepspeed.json"])
    ds_path = work / "ds.json"
    ds_path.write_text(json.dumps(effective_deepspeed_config(rendered, compute_settings(parsed.spec, False))))
    hostfile = work / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    spec = job["spec"]
    cmd = [
        *(PYTHON, "-u", "-m", "deepspeed.launcher.runner", "--no_ssh", "--node_rank=0", "--master_addr=127.0.0.1"),
        *(f"--master_port={free_port()}", "--hostfile", str(hostfile), "--log_level", "warning"),
        str(REPO / "benchmarks" / "dpo_trl_baseline.py"),
        *("--model", model, "--data", str(data), "--deepspeed", str(ds_path), "--out", str(work / "out-trl")),
        *("--steps", str(spec["training"]["maxSteps"]), "--micro", str(spec["training"]["microBatchSize"])),
        *("--max-length", str(spec["dataset"]["maxSeqLength"]), "--beta", str(spec["method"]["preference"]["beta"])),
        *("--learning-rate", str(spec["training"]["learningRate"])),
    ]
    proc = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"TRL baseline failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    results = _results(proc.stdout)
    tokens, seconds = sum(r["tokens"] for r in results), max(r["train_runtime"] for r in results)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "mean_loss": results[0]["loss"],  # TRL's train_loss: the mean over the run's steps
        "peak_gib": max(r["peak_rss_bytes"] for r in results) / GIB,
    }


def _results(stdout: str) -> list[dict[str, Any]]:
    """Each rank's TRL_RESULT object; two ranks' lines can interleave on one line of the launcher's output."""
    decoder, marker, found = json.JSONDecoder(), "TRL_RESULT ", []
    at = stdout.find(marker)
    while at >= 0:
        value, end = decoder.raw_decode(stdout, at + len(marker))
        found.append(value)
        at = stdout.find(marker, end)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro", type=int, default=8, help="pairs per micro-batch")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct instead of the tiny Llama")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 2 steps of 2 pairs per rank")
    parser.add_argument(
        "--model-cache", type=Path, default=Path.home() / ".cache" / "finetune-operator" / "builtin-models"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.micro = 2, 2
    if importlib.util.find_spec("trl") is None:
        parser.error("trl is not installed (dev group of the lock): run scripts/bootstrap.sh")
    from finetune_trainer.data.builtin_datasets import secret_code_preference_records
    from finetune_trainer.model.builtin_models import SMOLLM2, materialise_model

    with tempfile.TemporaryDirectory(prefix="ftjob-bench-") as tmp:
        work = Path(tmp)
        name = SMOLLM2 if args.smollm2 else "tiny-llama"
        model = str(
            materialise_model(
                name, args.model_cache if args.smollm2 else work / "models", 42 if not args.smollm2 else 0
            )
        )
        data = work / "pairs.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in secret_code_preference_records(3000, seed=3)))
        lr = 0.002 if args.smollm2 else 0.001
        job = _job(model, data, args.steps, args.micro, 96, args.beta, lr)
        ours = run_ours(work, job)
        theirs = run_trl(work, model, data, job)
    print(
        f"\n{name}, secret-code pairs, DPO + LoRA r=16, beta {args.beta}, {args.steps} steps x {2 * args.micro} pairs"
    )
    print(f"{'':8} {'useful tokens':>13} {'seconds':>8} {'useful tok/s':>12} {'peak GiB/rank':>13} {'mean loss':>10}")
    for label, row in (("ftjob", ours), ("TRL", theirs)):
        print(
            f"{label:8} {row['tokens']:13.0f} {row['seconds']:8.1f} {row['tokens_per_s']:12.0f} "
            f"{row['peak_gib']:13.2f} {row['mean_loss']:10.4f}"
        )
    print(
        f"ratio ftjob/TRL: tokens/s {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}, "
        f"peak memory {ours['peak_gib'] / theirs['peak_gib']:.2f}; ftjob's last step preference accuracy "
        f"{ours['accuracy']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
