"""`ftjob logs JOB [-f] [--rank N]`: the trainer log of one rank, found without naming pods.

The job's spec says how many ranks each pod runs, so global rank N is pod N // ranks-per-pod.
With `-f` the log is followed across gang restarts (the rank's next pod) until the job ends.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..client import FineTuneClient
from .cluster_args import EXIT_CODES_HELP, add_cluster_args, run_with_client


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("job", metavar="JOB", help="FineTuneJob name")
    parser.add_argument("-f", "--follow", action="store_true", help="follow, across restarts, until the job ends")
    parser.add_argument("--rank", type=int, default=0, metavar="N", help="global rank whose pod to read (default 0)")
    parser.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of the current pod")
    add_cluster_args(parser)


def run(args: argparse.Namespace) -> int:
    def body(client: FineTuneClient) -> int:
        try:
            for line in client.logs(args.job, rank=args.rank, follow=args.follow, tail_lines=args.tail):
                print(line, flush=True)
        except ValueError as exc:  # a rank outside the job's world
            print(f"ftjob logs: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `ftjob logs JOB | head`: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            return 0
        return 0

    return run_with_client(args, body)
