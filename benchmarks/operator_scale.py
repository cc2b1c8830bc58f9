"""Operator at scale on the local control plane: latency to children and idle cost.

Applies N FineTuneJobs at once (1 pod × 1 GPU each, on kwok GPU nodes) against a real
apiserver, scheduler and StatefulSet controller, and measures from the moment each
create call returned:
- apply → StatefulSet created (seen on a watch), p50 / p99;
- apply → status.state Running (all pods Running and Ready on kwok), p50 / p99.
Then it keeps M jobs around and samples the operator's RSS and CPU while idle.

Side by side, a *floor* run (before the operator starts, in its own namespace) gets the
same burst of creations and does the same writes without the operator: a controller in
this script that only writes (children planned and rendered before the clock starts,
server-side applied from 16 threads the moment the watch shows a job). What the floor
takes is this machine (apiserver, etcd, controllers and this script share its cores);
what the operator adds is the difference. The CPU seconds of each process and the
apiserver's own request counts per job are printed for both, which says where a burst's
time goes.

    PYTHONPATH=. .venv/bin/python benchmarks/operator_scale.py [--jobs 200] [--idle-jobs 500] [--idle-seconds 60]
        [--no-floor] [--workers N] [--profile burst.txt]   # py-spy (bench group) samples the operator's burst
    PYTHONPATH=. .venv/bin/python benchmarks/operator_scale.py --smoke   # 3 jobs, 4 idle: every path, ~1 min

Run on demand; timings on a shared 2-core machine are noisy, so nothing asserts them. A burst in
which some job never got its StatefulSet (or, for the operator, never ran), or a floor write
that failed, ends the run with exit status 1 and no figures: a partial burst's percentiles
would describe the jobs that happened to succeed.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from finetune_localcluster import LocalCluster
from finetune_localcluster.devtools import OperatorProcess, install_crd
from finetune_localcluster.kube import Kube
from tests.factories import job_document

NS = "scale"
FLOOR_NS = "scale-floor"
IMAGE = "trainer:test"


def jobs_path(namespace: str) -> str:
    return f"/apis/finetune.dev/v1alpha1/namespaces/{namespace}/finetunejobs"


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
                    event = json.loads(line)
                    obj = event.get("object", {})
                    name = obj.get("metadata", {}).get("name", "")
                    if name and name not in seen and pred(obj):
                        seen[name] = time.monotonic()
        except requests.RequestException:
            time.sleep(0.5)


def cpu_by_process(operator_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) so far of the operator and every control-plane process."""
    out: dict[str, float] = {}
    procs = {p.pid: p for p in psutil.Process().children(recursive=True)}
    if operator_pid is not None:
        procs[operator_pid] = psutil.Process(operator_pid)
    for proc in procs.values():
        try:
            name = "operator" if proc.pid == operator_pid else proc.name()
            times = proc.cpu_times()
            out[name] = out.get(name, 0.0) + times.user + times.system
        except psutil.Error:
            continue
    me = psutil.Process().cpu_times()
    out["this script"] = me.user + me.system
    return out


def api_requests(kube: Kube) -> dict[str, float]:
    """The apiserver's own count of requests so far, by verb and resource (its /metrics)."""
    text = kube.session.get(kube.server + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        inside, value = line[line.index("{") + 1 :].rsplit("} ", 1)
        labels = {k: v.strip('"') for k, v in (part.split("=", 1) for part in inside.split(","))}
        sub = labels.get("subresource", "")
        key = f"{labels.get('verb', '')} {labels.get('resource', '')}{'/' + sub if sub else ''}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy samples the operator (all threads) until interrupted."""
    spy = Path(sys.executable).with_name("py-spy")
    argv = [str(spy), "record", "--pid", str(pid), "--output", str(out), "--format", "raw", "--rate", "50"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def document(namespace: str, i: int) -> dict[str, Any]:
    doc = job_document(resources={"numNodes": 1, "gpusPerNode": 1},
                       dataset={"uri": "/data/train.jsonl"}, output={"uri": "/out"})  # fmt: skip
    doc["metadata"] = {"name": f"job-{i:04d}", "namespace": namespace}
    return doc


class MeasurementFailed(Exception):
    """A burst or the idle phase produced no complete measurement; the run prints no figures."""


@dataclass
class Burst:
    to_sts: list[float]
    to_run: list[float]
    wall_to_last_sts: float
    created_within: float
    cpu: dict[str, float]
    requests: dict[str, float]

    def require_complete(self, label: str, jobs: int, until_running: bool, timeout: float) -> None:
        """Raise `MeasurementFailed` unless every job got its StatefulSet (and ran, when asked)."""
        if len(self.to_sts) < jobs:
            raise MeasurementFailed(
                f"{label}: {len(self.to_sts)} of {jobs} jobs got a StatefulSet within {timeout:.0f} s"
            )
        if until_running and len(self.to_run) < jobs:
            raise MeasurementFailed(
                f"{label}: {len(self.to_run)} of {jobs} jobs reached Running within {timeout:.0f} s"
            )

    def request_line(self) -> str:
        jobs = max(1, len(self.to_sts))
        ranked = sorted(((n, c) for n, c in self.requests.items() if c >= jobs / 10), key=lambda kv: -kv[1])
        return "  apiserver requests per job during the burst: " + ", ".join(f"{n} {c / jobs:.1f}" for n, c in ranked)

    def cpu_line(self, label: str) -> str:
        ranked = sorted(((n, c) for n, c in self.cpu.items() if c >= 0.05), key=lambda kv: -kv[1])
        return (f"{label:<9} CPU seconds until the last StatefulSet ({self.wall_to_last_sts:.1f}s wall, 2 cores): "
                + ", ".join(f"{name} {cpu:.1f}" for name, cpu in ranked))  # fmt: skip

    def line(self, label: str) -> str:
        sts, run = self.to_sts, self.to_run
        text = (f"{label:<9} apply → StatefulSet p50 {statistics.median(sts):6.2f}s p99 {pct(sts, 0.99):6.2f}s"
                f"   (n={len(sts)}, created within {self.created_within:.1f}s,"
                f" last after {self.wall_to_last_sts:.1f}s)")  # fmt: skip
        if run:
            text += f"   apply → Running p50 {statistics.median(run):6.2f}s p99 {pct(run, 0.99):6.2f}s (n={len(run)})"
        return text


def burst(
    cluster: LocalCluster,
    namespace: str,
    jobs: int,
    create: Callable[[Kube, int], float],
    operator_pid: int | None,
    until_running: bool,
    first: int = 0,
    timeout: float = 600,
    failures: list[str] | None = None,
) -> Burst:
    """Create jobs first..first+jobs-1 from 16 threads; time each to its StatefulSet (and to Running).

    Stops waiting at `timeout`, or as soon as `failures` (a writer's error list) is not empty.
    """
    stop = threading.Event()
    sts_seen: dict[str, float] = {}
    running_seen: dict[str, float] = {}
    watchers = [
        threading.Thread(target=watch_times, daemon=True, args=(
            cluster, f"/apis/apps/v1/namespaces/{namespace}/statefulsets", stop, sts_seen, lambda o: True)),
        threading.Thread(target=watch_times, daemon=True, args=(
            cluster, jobs_path(namespace), stop, running_seen,
            lambda o: (o.get("status") or {}).get("state") == "Running")),
    ]  # fmt: skip
    for w in watchers:
        w.start()
    time.sleep(1)
    kube = cluster.kube()
    applied: dict[str, float] = {}
    failed = failures if failures is not None else []

    def one(i: int) -> None:
        applied[f"job-{i:04d}"] = create(kube, i)  # when the job existed

    def waiting(seen: dict[str, float]) -> bool:
        return time.monotonic() < deadline and not failed and len(set(applied) - set(seen)) > 0

    before = cpu_by_process(operator_pid)
    asked = api_requests(kube)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, range(first, first + jobs)))
    created_within = time.monotonic() - started
    deadline = time.monotonic() + timeout
    while waiting(sts_seen):
        time.sleep(0.2)
    wall = time.monotonic() - started
    spent = {name: cpu - before.get(name, 0.0) for name, cpu in cpu_by_process(operator_pid).items()}
    requests = {name: n - asked.get(name, 0.0) for name, n in api_requests(kube).items()}
    while until_running and waiting(running_seen):
        time.sleep(1)
    stop.set()
    to_sts = [sts_seen[n] - t for n, t in applied.items() if n in sts_seen]
    to_run = [running_seen[n] - t for n, t in applied.items() if n in running_seen]
    return Burst(to_sts, to_run, wall, created_within, spent, requests)


class IdealController:
    """The floor: a controller that only writes. It watches jobs like the operator does, and the
    moment one appears, one of 16 threads server-side applies its children (planned and
    rendered before the clock started) and writes its status. No decisions, no indexes, no
    events: what it takes is what the apiserver and this machine need for a burst's writes.
    A write that fails lands in `failures`, which ends the burst's wait."""

    def __init__(self, cluster: LocalCluster, jobs: int) -> None:
        from kubernetes import config

        from finetune_operator.api import FineTuneJob
        from finetune_operator.plan import choose_plan
        from finetune_operator.reconcile.cluster_io import KubernetesClusterIO
        from finetune_operator.render.manifests import render_all
        from finetune_operator.render.options import RenderOptions

        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        api.configuration.connection_pool_maxsize = 20
        self.io = KubernetesClusterIO(api)
        self.cluster = cluster
        self.failures: list[str] = []
        options = RenderOptions(trainer_image=IMAGE)
        self.prepared: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
        for i in range(jobs):
            doc = document(FLOOR_NS, i)
            job = FineTuneJob.from_manifest({**doc, "metadata": {**doc["metadata"], "uid": "UID"}})
            plan = choose_plan(job.spec)
            children = render_all(job, plan, options, job.spec.resources.num_nodes)
            self.prepared[doc["metadata"]["name"]] = (children, {"plan": plan.to_wire()})
        self.pool = ThreadPoolExecutor(max_workers=16)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        kube = self.cluster.kube()
        seen: set[str] = set()
        while not self.stop.is_set():  # again after an error or a timeout (e.g. the CRD not served yet)
            try:
                with kube.session.get(kube.server + jobs_path(FLOOR_NS), params={"watch": "1", "timeoutSeconds": "60"},
                                      stream=True, timeout=90) as resp:  # fmt: skip
                    for line in resp.iter_lines():
                        event = json.loads(line) if line else {}
                        meta = (event.get("object") or {}).get("metadata") or {}
                        if event.get("type") == "ADDED" and meta.get("name") not in seen:
                            seen.add(meta["name"])
                            self.pool.submit(self._write, meta)
            except requests.RequestException:
                pass
            time.sleep(0.2)

    def _write(self, meta: dict[str, Any]) -> None:
        try:
            self._write_children(meta)
        except Exception as exc:  # a failed write must be seen, not leave the burst waiting
            self.failures.append(f"floor: writing the children of {meta['name']} failed: {exc!r}")
            print(self.failures[-1], file=sys.stderr)

    def _write_children(self, meta: dict[str, Any]) -> None:
        children, status = self.prepared[meta["name"]]
        for child in children:
            for owner in child["metadata"].get("ownerReferences", []):
                owner["uid"] = meta["uid"]
        self.io.apply(children, owner_uid=meta["uid"])
        self.io.patch_status(FLOOR_NS, meta["name"], meta["resourceVersion"], status)

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)


def floor_creator(kube: Kube, i: int) -> float:
    kube.create(jobs_path(FLOOR_NS), document(FLOOR_NS, i))
    return time.monotonic()


def user_creator(kube: Kube, i: int) -> float:
    """What `kubectl apply` does: create the job; the operator does the rest."""
    kube.create(jobs_path(NS), document(NS, i))
    return time.monotonic()


def delete_namespace(kube: Kube, namespace: str, timeout: float = 300) -> None:
    kube.delete(f"/api/v1/namespaces/{namespace}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kube.get(f"/api/v1/namespaces/{namespace}")
        except Exception:
            return
        time.sleep(1)


@dataclass(frozen=True)
class Sizes:
    """How big a run is, and how long it waits for each phase."""

    jobs: int
    idle_jobs: int
    idle_seconds: float
    timeout: float
    """Seconds a burst waits for its last StatefulSet (and Running)."""
    settle: float
    """Seconds between phases, for the garbage collector's and the endpoint controllers' clean-up."""


SMOKE = Sizes(jobs=3, idle_jobs=4, idle_seconds=3, timeout=120, settle=2)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Sizes]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--idle-jobs", type=int, default=500)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--timeout", type=float, default=600, help="seconds a burst waits for its StatefulSets")
    parser.add_argument("--no-floor", action="store_true", help="skip the no-operator baseline")
    parser.add_argument("--workers", type=int, default=None, help="the operator's --workers (default: its own)")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the operator during the burst into FILE")
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run of every path: {SMOKE}")
    args = parser.parse_args(argv)
    if args.smoke:
        return args, SMOKE
    return args, Sizes(args.jobs, args.idle_jobs, args.idle_seconds, args.timeout, settle=15)


def measure_floor(cluster: LocalCluster, sizes: Sizes) -> Burst:
    kube = cluster.kube()
    kube.create("/api/v1/namespaces", {"metadata": {"name": FLOOR_NS}})
    ideal = IdealController(cluster, sizes.jobs)
    time.sleep(1)
    try:
        floor = burst(cluster, FLOOR_NS, sizes.jobs, floor_creator, None, until_running=False,
                      timeout=sizes.timeout, failures=ideal.failures)  # fmt: skip
    finally:
        ideal.close()
    if ideal.failures:
        raise MeasurementFailed(f"{len(ideal.failures)} floor writes failed, the first: {ideal.failures[0]}")
    floor.require_complete("floor", sizes.jobs, until_running=False, timeout=sizes.timeout)
    delete_namespace(kube, FLOOR_NS)
    time.sleep(sizes.settle)
    return floor


def measure_operator(
    cluster: LocalCluster, operator: OperatorProcess, sizes: Sizes, profile: Path | None, floor: Burst | None
) -> None:
    assert operator.proc is not None
    pid = operator.proc.pid
    spy = start_profile(pid, profile) if profile else None
    measured = burst(cluster, NS, sizes.jobs, user_creator, pid, True, timeout=sizes.timeout)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        print(f"profile of the operator during the burst: {profile}")
    measured.require_complete("operator", sizes.jobs, until_running=True, timeout=sizes.timeout)
    lines = [measured.line("operator"), measured.request_line()]
    if floor is not None:
        ratio = measured.wall_to_last_sts / floor.wall_to_last_sts
        lines.append(f"operator / floor, burst start → last StatefulSet: {ratio:.2f}x")
    lines += [run.cpu_line(label) for label, run in (("floor", floor), ("operator", measured)) if run is not None]
    print("\n".join(lines), flush=True)
    total = len(measured.to_run)
    if sizes.idle_jobs > sizes.jobs:
        more = sizes.idle_jobs - sizes.jobs
        rest = burst(cluster, NS, more, user_creator, pid, True, first=sizes.jobs, timeout=sizes.timeout)
        rest.require_complete("operator, jobs kept for the idle phase", more, until_running=True, timeout=sizes.timeout)
        total += len(rest.to_run)
    proc = psutil.Process(pid)
    time.sleep(min(10, sizes.settle))
    cpu0, t0 = proc.cpu_times(), time.monotonic()
    rss: list[int] = []
    while not rss or time.monotonic() - t0 < sizes.idle_seconds:
        rss.append(proc.memory_info().rss)
        time.sleep(1)
    cpu1 = proc.cpu_times()
    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    print(f"idle with {total} running jobs: RSS max {max(rss) / 2**20:.0f} MiB, "
          f"CPU {100 * used / (time.monotonic() - t0):.1f}% of one core (interval 5 s)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args, sizes = parse_args(argv)
    nodes = (max(sizes.jobs, sizes.idle_jobs) + 7) // 8
    with (
        tempfile.TemporaryDirectory(prefix="ftjob-scale-") as tmp,
        LocalCluster(Path(tmp) / "cluster", gpu_nodes=nodes) as cluster,
    ):
        work = Path(tmp)
        kube = cluster.kube()
        install_crd(kube)
        operator: OperatorProcess | None = None
        try:
            floor = None
            if not args.no_floor:
                floor = measure_floor(cluster, sizes)
                print(floor.line("floor"), flush=True)
                print(floor.request_line(), flush=True)
            kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
            flags = ("--interval", "5", "--namespace", NS, *(("--workers", str(args.workers)) if args.workers else ()))
            operator = OperatorProcess(cluster.kubeconfig, work / "operator.log", extra_args=flags)
            operator.start()
            measure_operator(cluster, operator, sizes, args.profile, floor)
        except MeasurementFailed as exc:
            print(f"operator_scale: measurement failed, no figures: {exc}", file=sys.stderr)
            if operator is not None:
                print(f"the operator's log ends:\n{operator.log_tail()}", file=sys.stderr)
            return 1
        finally:
            if operator is not None:
                operator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
