"""`ftjob submit -f job.yaml [--wait] [--follow]`: create a FineTuneJob, then optionally follow it.

The file is validated by the API's models first; a refusal (local or the apiserver's) prints
one line per field, as `ftjob validate` does, and exits 2. `--follow` streams rank 0's log
across restarts until the job ends; `--wait` shows live progress and exits as `ftjob wait`.
"""

from __future__ import annotations

import argparse
import sys

from ..client import FineTuneClient, JobRejected
from ..client.views import parse_duration
from .cluster_args import EXIT_CODES_HELP, add_cluster_args, run_with_client
from .wait_cmd import wait_for


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("-f", "--filename", required=True, metavar="FILE", help="YAML file with one FineTuneJob")
    parser.add_argument("--name", help="create it under this name instead of metadata.name")
    parser.add_argument("--wait", action="store_true", help="wait until it Succeeded (exit 1 if it Failed)")
    parser.add_argument("--follow", action="store_true", help="stream rank 0's log until the job ends")
    parser.add_argument("--timeout", default="", metavar="DURATION", help="with --wait: give up after this long")
    add_cluster_args(parser)


def run(args: argparse.Namespace) -> int:
    try:
        timeout = parse_duration(args.timeout) if args.timeout else None
    except ValueError as exc:
        print(f"ftjob submit: {exc}", file=sys.stderr)
        return 2
    return run_with_client(args, lambda client: _submit(client, args, timeout))


def _submit(client: FineTuneClient, args: argparse.Namespace, timeout: float | None) -> int:
    try:
        job = client.submit(args.filename, name=args.name)
    except JobRejected as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print(f"finetunejob.finetune.dev/{job.name} created in {job.namespace}")
    if args.follow:
        for line in client.logs(job.name, rank=0, follow=True, namespace=job.namespace):
            print(line, flush=True)
    if args.wait:
        return wait_for(client, job.name, ("Succeeded",), timeout, quiet=False, namespace=job.namespace)
    if args.follow:
        final = client.get(job.name, namespace=job.namespace)
        state = final.status.state if final.status else None
        print(f"{job.name} is {state}", file=sys.stderr)
        return 1 if state == "Failed" else 0
    return 0
