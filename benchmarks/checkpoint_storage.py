"""Checkpoint save and resume time: output on a local claim against output on S3.

Runs the real pod entrypoint (`ftjob train`, 2 CPU ranks over gloo) for the demo jobs: the tiny
Llama (examples/tiny-cpu.yaml's LoRA) and SmolLM2-135M-Instruct (examples/smollm2-cpu.yaml's
LoRA), each twice per storage: a first run is SIGKILLed right after its checkpoints, a second
resumes from the newest one. The trainer logs each save (write, and for S3 upload and commit)
and the resume (for S3 the download of what the ranks read, then the load) in train_log.jsonl:
the medians are printed, with the S3 run's ratio to the claim's (the baseline,
run side by side). "claim" is a local folder standing in for a mounted volume; "s3" is
SeaweedFS on loopback (built from Go modules on first use), so the network is the loopback's:
the S3 column is the protocol's and the server's cost, not a WAN's.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/checkpoint_storage.py [--smoke] [--models tiny smollm2]

`--smoke` runs the tiny job only, with one checkpoint per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster.ports import free_port

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {"tiny": REPO / "examples" / "tiny-cpu.yaml", "smollm2": REPO / "examples" / "smollm2-cpu.yaml"}
BUCKET = "ftjob-bench"


def _job(model: str, output: str, steps: int, every: int, storage: dict[str, Any] | None) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLES[model].read_text())
    spec = doc["spec"]
    spec["training"].update({"maxSteps": steps, "checkpointEverySteps": every, "evalEverySteps": 10_000})
    spec["training"]["checkpointsToKeep"] = 2
    spec["resources"] = {"numNodes": 2, "gpusPerNode": 0}  # world 2; both ranks on this machine
    spec["output"] = {"uri": output}
    if storage is not None:
        spec["objectStorage"] = storage
    doc["metadata"] = {"name": f"bench-{model}"}
    return doc


def _run(config: Path, out: Path, env: dict[str, str], kill_at: int | None) -> int:
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import choose_plan
    from finetune_operator.render.config_files import config_files

    job = FineTuneJob.from_manifest(yaml.safe_load(config.read_text()))
    folder = config.parent / "config"
    folder.mkdir(exist_ok=True)
    for name, content in config_files(job, choose_plan(job.spec), "localhost slots=2\n").items():
        (folder / name).write_text(content)
    full = {
        **os.environ,
        **env,
        "FTJOB_OUTPUT_DIR": str(out),
        "FTJOB_TERMINATION_LOG": str(out.parent / "termination-log"),
        "FTJOB_METRICS_PORT": "off",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "NODE_RANK": "0",
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "FTJOB_FAULT_ONCE_DIR": str(out.parent),
    }
    if kill_at is not None:
        full["FTJOB_FAULT_KILL"] = f"step:{kill_at}"
    cmd = [sys.executable, "-m", "finetune_operator.cli.main", "train", "--config", str(folder)]
    return subprocess.run(cmd, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode


def _timings(train_log: Path) -> tuple[list[float], list[float]]:
    entries = [json.loads(x) for x in train_log.read_text().splitlines() if x.strip()]
    saves = [e["checkpoint"]["seconds"] for e in entries if "checkpoint" in e]
    resumes = [e["resume"]["seconds"] for e in entries if "resume" in e]
    return saves, resumes


def measure(model: str, where: str, steps: int, every: int, server: Any, work: Path) -> dict[str, float]:
    """Save times of the first run, resume time of the second (killed after the last save)."""
    work.mkdir(parents=True)
    local = work / "scratch" / "output"
    local.parent.mkdir(parents=True)
    env: dict[str, str] = {"FTJOB_S3_MIRROR": str(work / "mirror")}
    storage = None
    if where == "s3":
        storage = {"endpoint": server.endpoint, "pathStyle": True, "credentials": {"secretName": "bench"}}
        env |= {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
        output = f"s3://{BUCKET}/{work.name}"
    else:
        output = str(local)
    config = work / "job.yaml"
    config.write_text(yaml.safe_dump(_job(model, output, steps, every, storage)))
    code = _run(config, local, env, kill_at=steps - 1)
    if code == 0:
        raise RuntimeError(f"{model}/{where}: the first run was not killed")
    saves, _ = _timings(local / "train_log.jsonl")
    if where == "s3":  # a new pod: its scratch is empty
        (local / "train_log.jsonl").rename(work / "first_log.jsonl")
        for child in local.iterdir():
            subprocess.run(["rm", "-rf", str(child)], check=True)
    code = _run(config, local, env, kill_at=None)
    if code != 0:
        raise RuntimeError(f"{model}/{where}: the resumed run failed ({code}); see {work}")
    _, resumes = _timings(local / "train_log.jsonl")
    return {"save_s": statistics.median(saves), "saves": len(saves), "resume_s": resumes[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="the tiny job only, one checkpoint per run")
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=sorted(EXAMPLES))
    args = parser.parse_args(argv)
    from finetune_localcluster.s3server import S3Server

    models = ["tiny"] if args.smoke else args.models
    steps, every = (3, 1) if args.smoke else (7, 2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ftjob-bench-ckpt-") as tmp, S3Server(Path(tmp) / "s3") as server:
        server.client().create_bucket(Bucket=BUCKET)
        for model in models:
            for where in ("claim", "s3"):
                result = measure(model, where, steps, every, server, Path(tmp) / f"{model}-{where}")
                rows.append((model, where, result))
                print(f"{model:8s} {where:6s} save {result['save_s']:.2f} s (median of {result['saves']:.0f}), "
                      f"resume {result['resume_s']:.2f} s", flush=True)  # fmt: skip
    print("\n| job | output | checkpoint save (s, median) | × claim | resume (s) | × claim |")
    print("|---|---|---|---|---|---|")
    baseline = {model: result for model, where, result in rows if where == "claim"}
    for model, where, result in rows:
        base = baseline[model]
        print(
            f"| {model} | {where} | {result['save_s']:.2f} | {result['save_s'] / base['save_s']:.2f}x "
            f"| {result['resume_s']:.2f} | {result['resume_s'] / base['resume_s']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
