"""`ftjob validate FILE...`: the same verdict the apiserver and the operator give, offline."""

from __future__ import annotations

import argparse
import sys

from ..plan import PlanningError, choose_plan
from .manifests import load_jobs


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files ('-' for stdin)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only")


def run(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        loaded = load_jobs(path)
        for line in loaded.problems:
            print(line, file=sys.stderr)
        failed = failed or bool(loaded.problems)
        for job in loaded.jobs:
            try:  # the operator's deeper validation: the model is known, the settings suit it, it fits
                choose_plan(job.spec)
            except PlanningError as exc:
                print(f"{path}: {job.name}: {exc.condition_reason}: {exc}", file=sys.stderr)
                failed = True
                continue
            if args.quiet:
                continue
            spec, res = job.spec, job.spec.resources
            where = f"{res.num_nodes}×{res.gpus_per_node} GPUs of {res.gpu_memory}"
            if res.gpus_per_node == 0:
                where = f"{res.num_nodes} pod{'s' if res.num_nodes > 1 else ''} × 1 CPU rank"
            print(f"{path}: {job.name}: valid ({spec.method.type}, {spec.model.uri}, {where})")
        if args.quiet:
            continue
        for line in loaded.skipped:
            print(f"{line}: skipped")
        if not loaded.jobs and not loaded.problems:
            print(f"{path}: no FineTuneJob found", file=sys.stderr)
            failed = True
    return 1 if failed else 0
