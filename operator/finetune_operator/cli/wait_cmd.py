"""`ftjob wait JOB --for Succeeded --timeout 2h`: block until a job reaches a state.

Exits 0 when it does, 1 when the job failed (or finished without reaching it), 124 with a
message naming the state it is in when the timeout passes.
"""

from __future__ import annotations

import argparse
import sys

from ..client import FineTuneClient
from ..client.views import WAITABLE_STATES, parse_duration, parse_states
from .cluster_args import EXIT_CODES_HELP, add_cluster_args, run_with_client
from .progress_display import ProgressDisplay


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("job", metavar="JOB", help="FineTuneJob name")
    parser.add_argument(
        "--for",
        dest="states",
        action="append",
        metavar="STATE",
        help=f"state to wait for: {', '.join(WAITABLE_STATES)} (repeat or comma-separate for any of them; "
        "default Succeeded)",
    )
    parser.add_argument(
        "--timeout",
        default="",
        metavar="DURATION",
        help="give up after this long (2h, 30m, 90s) and exit 124; exit 1 when the job failed instead",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    add_cluster_args(parser)


def run(args: argparse.Namespace) -> int:
    try:
        states = parse_states(args.states or ["Succeeded"])
        timeout = parse_duration(args.timeout) if args.timeout else None
    except ValueError as exc:
        print(f"ftjob wait: {exc}", file=sys.stderr)
        return 2
    return run_with_client(args, lambda client: wait_for(client, args.job, states, timeout, quiet=args.quiet))


def wait_for(
    client: FineTuneClient,
    name: str,
    states: tuple[str, ...],
    timeout: float | None,
    *,
    quiet: bool,
    namespace: str | None = None,
) -> int:
    display = None if quiet else ProgressDisplay(sys.stderr)
    try:
        job = client.wait(name, states, timeout=timeout, on_progress=display, namespace=namespace)
    finally:
        if display is not None:
            display.close()
    print(f"{job.name} is {job.status.state if job.status else 'Pending'}")
    return 0
