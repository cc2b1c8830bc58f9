"""What the day-two verbs (`submit`, `logs`, `wait`, `describe`) share: the cluster options,
the client they build from them, and how the client's errors become exit codes.

Exit codes: 0 done; 1 the job failed, or an apiserver error; 2 a refused spec or a bad
argument; 3 no such job; 124 a wait that timed out (as timeout(1)); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..client import FineTuneClient, FineTuneClientError, JobNotFound

NOT_FOUND_EXIT_CODE = 3
EXIT_CODES_HELP = (
    "exit status: 0 done; 1 the job failed (or the apiserver answered an error); 2 a refused spec or bad "
    "argument; 3 no such job; 124 timed out; 130 interrupted"
)


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")
    group.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    group.add_argument("--context", help="kubeconfig context (default: the current one)")


def client_from(args: argparse.Namespace) -> FineTuneClient:
    return FineTuneClient(args.namespace, kubeconfig=args.kubeconfig, context=args.context)


def run_with_client(args: argparse.Namespace, body: Callable[[FineTuneClient], int]) -> int:
    """Run `body` with a client; a client error is printed on stderr and mapped to its exit code."""
    try:
        client = client_from(args)
    except Exception as exc:  # kubeconfig missing or unreadable: kubernetes raises several kinds
        print(f"cannot reach a cluster: {exc}", file=sys.stderr)
        return 1
    with client:
        try:
            return body(client)
        except JobNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return NOT_FOUND_EXIT_CODE
        except FineTuneClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
