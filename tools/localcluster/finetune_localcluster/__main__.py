"""`python -m finetune_localcluster up|down|env|prebuild`: the local cluster for a developer's shell.

Why a CLI next to the Python API: the demo and manual debugging (`kubectl get ftj`) need a
cluster that outlives one Python process. `up` starts the processes detached, records their
pids in `<workdir>/cluster.json` and prints shell exports; `down` stops exactly those pids and
removes the work dir; `env` prints the exports again. `prebuild` builds what the cluster and
trainer tiers start besides the cluster (Kueue, the S3 server, MLflow's venv) before any test
does (see finetune_localcluster.prebuild).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from finetune_localcluster.cluster import ClusterError, LocalCluster
from finetune_localcluster.prebuild import prebuild

DEFAULT_WORKDIR = Path(os.environ.get("FTJOB_CLUSTER_DIR", "/tmp/ftjob-localcluster"))


def _print_env(cluster: LocalCluster) -> None:
    for key, value in cluster.env().items():
        print(f"export {key}={shlex.quote(value)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_localcluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "env", "prebuild"])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--gpu-nodes", type=int, default=2, help="kwok-simulated GPU nodes")
    parser.add_argument("--process-nodes", type=int, default=1, help="nodes that really run pods")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--no-taint", action="store_true", help="do not taint process nodes (pods land there without a toleration)"
    )
    args = parser.parse_args(argv)

    if args.command == "prebuild":
        failed = prebuild()
        if failed:
            print(f"prebuild failed: {', '.join(failed)} (see the lines above)", file=sys.stderr)
        return 1 if failed else 0
    state = args.workdir / "cluster.json"
    if args.command == "up":
        if state.exists():
            print(f"a cluster is already recorded in {args.workdir}; run `down` first", file=sys.stderr)
            return 1
        cluster = LocalCluster(
            args.workdir,
            gpu_nodes=args.gpu_nodes,
            process_nodes=args.process_nodes,
            gpus_per_node=args.gpus_per_node,
            taint_process_nodes=not args.no_taint,
            detach=True,
        )
        try:
            cluster.up()
        except ClusterError as exc:
            print(f"cluster failed to start: {exc}", file=sys.stderr)
            return 1
        print(f"# cluster up at {cluster.server}; logs in {args.workdir / 'logs'}", file=sys.stderr)
        _print_env(cluster)
        return 0
    if not state.exists():
        print(f"no cluster recorded in {args.workdir}", file=sys.stderr)
        return 1 if args.command == "env" else 0
    cluster = LocalCluster.attach(args.workdir)
    if args.command == "env":
        _print_env(cluster)
    else:
        cluster.down()
        print(f"# cluster in {args.workdir} stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
