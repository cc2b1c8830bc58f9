"""`ftjob run FILE`: train a FineTuneJob on this machine, through the pod entrypoint's code path.

It plans the job, renders the same config files the operator mounts in pods, with a
hostfile that puts every rank (numNodes x ranks per node) on localhost, then runs the
entrypoint as a child process (`python -m finetune_trainer`, see `trainer_process`: the
operator never imports the trainer): the ranks are started by the node launcher exactly as in
a pod. SIGTERM and SIGINT reach it through this process; its exit status is this command's.
s3:// URIs work as in a pod, with the connection from spec.objectStorage (or FTJOB_S3_* variables)
and the credentials from this shell's environment (AWS_ACCESS_KEY_ID, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..api.pod_env import PodEnv
from ..api.storage_uri import is_s3
from ..api.tracking import tracking_uri_problem
from ..plan import choose_plan
from ..render.config_files import HOSTFILE, config_files
from ..render.tracking import with_default_tracking
from .manifests import load_one
from .trainer_process import MISSING_TRAINER_EXIT_CODE, missing_trainer, run_trainer

S3_MIRROR_DEFAULT = Path.home() / ".cache" / "finetune-operator" / "s3"
"""Where `ftjob run` keeps its copies of s3:// models and data (reused by the next run)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="YAML file with one FineTuneJob")
    parser.add_argument("--output", metavar="DIR", help="output folder (default: output.uri as a local path)")
    parser.add_argument("--master-port", type=int, default=29500, help="rendezvous port on 127.0.0.1")
    parser.add_argument("--keep-config", metavar="DIR", help="render the config into DIR and keep it")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI") or None,
        metavar="URL",
        help="MLflow tracking server when spec.tracking.mlflow names none (default: $MLFLOW_TRACKING_URI); "
        "credentials from $MLFLOW_TRACKING_TOKEN or $MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD",
    )


def run(args: argparse.Namespace) -> int:
    problem = tracking_uri_problem(args.tracking_uri)
    if problem:
        print(f"--tracking-uri: {problem}", file=sys.stderr)
        return 2
    job = with_default_tracking(load_one(args.file), args.tracking_uri)
    plan = choose_plan(job.spec)
    world = job.spec.resources.world_size
    files = config_files(job, plan, hostfile=f"localhost slots={world}\n")
    staging = None
    if args.output:
        os.environ[PodEnv.FTJOB_OUTPUT_DIR] = str(Path(args.output).resolve())
    elif is_s3(job.spec.output.uri):  # the trainer uploads from a local staging folder
        staging = tempfile.TemporaryDirectory(prefix="ftjob-run-output-")
        os.environ[PodEnv.FTJOB_OUTPUT_DIR] = staging.name
    elif not job.spec.output.uri.startswith("/"):
        print(f"output.uri is {job.spec.output.uri} (a volume in the cluster): pass --output DIR", file=sys.stderr)
        return 2
    os.environ.setdefault(PodEnv.FTJOB_S3_MIRROR, str(S3_MIRROR_DEFAULT))
    os.environ[PodEnv.NODE_RANK] = "0"
    os.environ[PodEnv.MASTER_ADDR] = "127.0.0.1"
    os.environ[PodEnv.MASTER_PORT] = str(args.master_port)
    os.environ.setdefault(PodEnv.FTJOB_TERMINATION_LOG, os.devnull)
    print(
        f"{job.name}: {job.spec.method.type} on {job.spec.model.uri}, {world} rank(s) on this machine, "
        f"ZeRO-{plan.zero_stage}, micro-batch {plan.micro_batch_size} x accumulation "
        f"{plan.gradient_accumulation_steps}",
        file=sys.stderr,
    )
    missing = missing_trainer("run")
    if missing:
        print(missing, file=sys.stderr)
        return MISSING_TRAINER_EXIT_CODE
    with tempfile.TemporaryDirectory(prefix="ftjob-config-") as tmp:
        config_dir = Path(args.keep_config) if args.keep_config else Path(tmp) / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (config_dir / name).write_text(content)
        assert (config_dir / HOSTFILE).exists()
        trainer_args = ["--config", str(config_dir)] + ([] if args.no_progress else ["--progress"])
        result = run_trainer(trainer_args, Path(tmp) / "result.json")
    if staging is not None:
        staging.cleanup()
    if result.summary is None:
        stopped = result.exit_code > 128  # a signal: the launcher and its ranks were stopped
        print(f"{'stopped' if stopped else 'failed'}: {result.message}", file=sys.stderr)
        return result.exit_code
    if result.message == "already completed":
        print("the output folder holds a completed run (COMPLETED.json); nothing to do", file=sys.stderr)
    print(_format_summary(result.summary), file=sys.stderr)
    print(json.dumps(result.summary, sort_keys=True))
    return result.exit_code


def _format_summary(summary: dict[str, object]) -> str:
    def num(key: str, spec: str) -> str:
        value = summary.get(key)
        return format(value, spec) if isinstance(value, (int, float)) else "n/a"

    lines = [
        f"steps {summary.get('steps')}, tokens {summary.get('tokens')} "
        f"({summary.get('trainedTokens', 'n/a')} trained), wall {num('wallSeconds', '.1f')} s",
        f"train loss (last step) {num('finalLoss', '.4f')}",
        f"eval loss {num('evalLossBefore', '.4f')} -> {num('evalLoss', '.4f')}",
    ]
    if "exactMatch" in summary:
        lines.append(f"exact match {num('exactMatchBefore', '.1%')} -> {num('exactMatch', '.1%')}")
    where = summary.get("adapterUri") or summary.get("modelUri")
    lines.append(f"saved to {where}")
    if summary.get("mergedModelUri"):
        lines.append(f"merged model: {summary['mergedModelUri']}")
    tracking = summary.get("tracking")
    if isinstance(tracking, dict):
        if tracking.get("runUrl"):
            lines.append(f"MLflow run: {tracking['runUrl']}")
        if tracking.get("unpublishedRecords"):
            lines.append(f"  {tracking['unpublishedRecords']} records not sent ({tracking.get('reason')})")
        if tracking.get("tensorboardLogDir"):
            lines.append(f"TensorBoard: tensorboard --logdir {tracking['tensorboardLogDir']}")
    return "\n".join(lines)
