"""Operator at scale on the local control plane: latency to children and idle cost.

Applies N FineTuneJobs at once (1 pod × 1 GPU each, on kwok GPU nodes) against a real
apiserver, scheduler and StatefulSet controller, and measures from the moment each
create call returned:
- apply → StatefulSet created (seen on a watch), p50 / p99;
- apply → status.state Running (all pods Running and Ready on kwok), p50 / p99.
Then it keeps M jobs around and samples the operator's RSS and CPU while idle.

    PYTHONPATH=. .venv/bin/python benchmarks/operator_scale.py [--jobs 200] [--idle-jobs 500] [--idle-seconds 60]

Run on demand; timings on a shared 2-core machine are noisy, so nothing asserts them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import requests

from finetune_localcluster import LocalCluster
from finetune_localcluster.devtools import OperatorProcess, install_crd
from tests.factories import job_document

NS = "scale"
JOBS = f"/apis/finetune.dev/v1alpha1/namespaces/{NS}/finetunejobs"


def watch_times(cluster: LocalCluster, path: str, stop: threading.Event, seen: dict[str, float], pred: Any) -> None:
    """Record when each object first satisfies `pred`, from a real watch stream."""
    kube = cluster.kube()
    while not stop.is_set():
        try:
            with kube.session.get(kube.server + path, params={"watch": "1", "timeoutSeconds": "30"},
                                  stream=True, timeout=40) as resp:  # fmt: skip
                for line in resp.iter_lines():
                    if stop.is_set():
                        return
                    if not line:
                        continue
                    event = requests.models.complexjson.loads(line)
                    obj = event.get("object", {})
                    name = obj.get("metadata", {}).get("name", "")
                    if name and name not in seen and pred(obj):
                        seen[name] = time.monotonic()
        except requests.RequestException:
            time.sleep(0.5)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--idle-jobs", type=int, default=500)
    parser.add_argument("--idle-seconds", type=float, default=60)
    args = parser.parse_args()
    nodes = (max(args.jobs, args.idle_jobs) + 7) // 8
    work = Path(tempfile.mkdtemp(prefix="ftjob-scale-"))
    with LocalCluster(work / "cluster", gpu_nodes=nodes) as cluster:
        kube = cluster.kube()
        install_crd(kube)
        kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        operator = OperatorProcess(cluster.kubeconfig, work / "operator.log", extra_args=("--interval", "5"))
        operator.start()
        stop = threading.Event()
        sts_seen: dict[str, float] = {}
        running_seen: dict[str, float] = {}
        watchers = [
            threading.Thread(target=watch_times, daemon=True, args=(
                cluster, f"/apis/apps/v1/namespaces/{NS}/statefulsets", stop, sts_seen, lambda o: True)),
            threading.Thread(target=watch_times, daemon=True, args=(
                cluster, JOBS, stop, running_seen, lambda o: (o.get("status") or {}).get("state") == "Running")),
        ]  # fmt: skip
        for w in watchers:
            w.start()
        time.sleep(1)
        applied: dict[str, float] = {}

        def create(i: int) -> None:
            doc = job_document(resources={"numNodes": 1, "gpusPerNode": 1},
                               dataset={"uri": "/data/train.jsonl"}, output={"uri": "/out"})  # fmt: skip
            doc["metadata"] = {"name": f"job-{i:04d}", "namespace": NS}
            kube.create(JOBS, doc)
            applied[f"job-{i:04d}"] = time.monotonic()

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(create, range(args.jobs)))
        print(f"applied {args.jobs} jobs in {time.monotonic() - started:.1f}s")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(running_seen) < args.jobs:
            time.sleep(1)
        to_sts = [sts_seen[n] - t for n, t in applied.items() if n in sts_seen]
        to_run = [running_seen[n] - t for n, t in applied.items() if n in running_seen]
        print(f"apply → StatefulSet: n={len(to_sts)} p50={statistics.median(to_sts):.2f}s p99={pct(to_sts, 0.99):.2f}s")
        print(f"apply → Running:     n={len(to_run)} p50={statistics.median(to_run):.2f}s p99={pct(to_run, 0.99):.2f}s")
        if args.idle_jobs > args.jobs:
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(create, range(args.jobs, args.idle_jobs)))
            while len(running_seen) < args.idle_jobs and time.monotonic() < deadline + 600:
                time.sleep(1)
        stop.set()
        assert operator.proc is not None
        proc = psutil.Process(operator.proc.pid)
        time.sleep(10)
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        rss = []
        while time.monotonic() - t0 < args.idle_seconds:
            rss.append(proc.memory_info().rss)
            time.sleep(1)
        cpu1 = proc.cpu_times()
        used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        print(f"idle with {len(running_seen)} running jobs: RSS max {max(rss) / 2**20:.0f} MiB, "
              f"CPU {100 * used / (time.monotonic() - t0):.1f}% of one core (interval 5 s)")  # fmt: skip
        operator.stop()


if __name__ == "__main__":
    main()
