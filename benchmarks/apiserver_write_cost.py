"""What one job's children cost to write, on both ends of the wire.

The operator writes each job's ConfigMap, headless Service and StatefulSet with server-side
apply through the generated Kubernetes client. This measures, per job (three children),
against a real apiserver and etcd, one writer thread, in interleaved rounds:

- the writer's own CPU: the generated client's apply methods (what the operator's `KubernetesClusterIO`
  calls) against the raw REST call with the same body and headers (no per-call argument
  validation or serialisation walk): is the client library worth bypassing? `KubernetesClusterIO.apply`
  itself is measured too: before each apply it reads the object (a 404 here, every name is
  new) so that it never takes over an object the job does not control;
- the apiserver's and etcd's CPU: server-side apply (the operator's way: idempotent, one
  field manager, restart-safe) against a plain POST create of the same objects (cheaper
  for the server; but a created object's fields belong to an Update manager, so a later
  apply that drops a field would not remove it).

    PYTHONPATH=. .venv/bin/python benchmarks/apiserver_write_cost.py [--jobs 60] [--rounds 3]
    PYTHONPATH=. .venv/bin/python benchmarks/apiserver_write_cost.py --smoke   # 2 jobs, 1 round

Run on demand; nothing asserts these numbers (shared, noisy machine). A write that fails ends
the run with its error and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config
from kubernetes.client import ApiClient

from finetune_localcluster import LocalCluster
from finetune_localcluster.devtools import install_crd
from finetune_operator.api import FineTuneJob
from finetune_operator.plan import choose_plan
from finetune_operator.reconcile.cluster_io import APPLY, TIMEOUT, KubernetesClusterIO
from finetune_operator.render.identity import FIELD_MANAGER
from finetune_operator.render.manifests import render_all
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document

NS = "write-cost"
PATHS = {"ConfigMap": ("/api/v1", "configmaps"), "Service": ("/api/v1", "services"),
         "StatefulSet": ("/apis/apps/v1", "statefulsets")}  # fmt: skip
SERVER = ("kube-apiserver", "etcd")
Obj = dict[str, Any]


def children() -> list[Obj]:
    """One job's children as the operator renders them; replicas 0, so no pods are made."""
    doc = job_document(resources={"numNodes": 1, "gpusPerNode": 1})
    doc["metadata"].update({"namespace": NS, "uid": "UID"})
    job = FineTuneJob.from_manifest(doc)
    objs = render_all(job, choose_plan(job.spec), RenderOptions(trainer_image="trainer:test"), 0)
    for obj in objs:
        obj["metadata"].pop("ownerReferences", None)  # no owner exists: the collector would delete them
    return objs


def generated_apply(api: ApiClient) -> Callable[[Obj], None]:
    """One server-side apply through the generated client's method, with `ClusterIO`'s arguments."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    methods: dict[str, Callable[..., Any]] = {
        "ConfigMap": core.patch_namespaced_config_map,
        "Service": core.patch_namespaced_service,
        "StatefulSet": apps.patch_namespaced_stateful_set,
    }

    def write(obj: Obj) -> None:
        meta = obj["metadata"]
        response = methods[obj["kind"]](meta["name"], meta["namespace"], obj, field_manager=FIELD_MANAGER, force=True,
                                        _content_type=APPLY, _preload_content=False,
                                        _request_timeout=TIMEOUT)  # fmt: skip
        _ = response.data
        response.release_conn()

    return write


def raw(api: ApiClient, obj: Obj, create: bool) -> None:
    """The same request as the generated method would send, straight to the REST layer."""
    meta, (prefix, plural) = obj["metadata"], PATHS[obj["kind"]]
    base = f"{api.configuration.host}{prefix}/namespaces/{meta['namespace']}/{plural}"
    url = f"{base}?fieldManager={FIELD_MANAGER}"
    if not create:
        url = f"{base}/{meta['name']}?fieldManager={FIELD_MANAGER}&force=true"
    headers = {"Content-Type": "application/json" if create else APPLY, "Accept": "application/json"}
    api.update_params_for_auth(headers, [], ["BearerToken"], None, "POST" if create else "PATCH", None)
    body = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    method = "POST" if create else "PATCH"
    response = api.rest_client.request(method, url, headers=headers, body=body,  # type: ignore[no-untyped-call]
                                       _request_timeout=TIMEOUT)  # fmt: skip
    urllib3_response = response.response
    _ = urllib3_response.data
    urllib3_response.release_conn()
    if response.status >= 300:
        raise RuntimeError(f"{obj['kind']} {meta['name']}: HTTP {response.status}")


def server_cpu() -> dict[str, float]:
    out = dict.fromkeys(SERVER, 0.0)
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() in out:
                t = proc.cpu_times()
                out[proc.name()] += t.user + t.system
        except psutil.Error:
            continue
    return out


def measure(template: list[Obj], write: Callable[[Obj], None], tag: str, jobs: int) -> dict[str, float]:
    """Milliseconds per job: this thread's CPU, the server processes' CPU, and wall time."""
    batches = []
    for i in range(jobs):
        objs = copy.deepcopy(template)
        for obj in objs:
            obj["metadata"]["name"] = f"{tag}-{i}"
        batches.append(objs)
    before, began, wall = server_cpu(), time.thread_time(), time.perf_counter()
    for objs in batches:
        for obj in objs:
            write(obj)
    mine, wall = time.thread_time() - began, time.perf_counter() - wall
    after = server_cpu()
    out = {"client": mine, "wall": wall, **{k: after[k] - before[k] for k in SERVER}}
    return {k: v / jobs * 1e3 for k, v in out.items()}


def line(label: str, m: dict[str, float]) -> str:
    return (f"  {label:<28} client {m['client']:5.2f}  apiserver {m['kube-apiserver']:5.1f}  "
            f"etcd {m['etcd']:4.1f}  wall {m['wall']:5.1f}  ms/job")  # fmt: skip


def ratio(part: float, whole: float) -> str:
    """Two decimals, or '-' when the base is below the clock's resolution (a few writes in --smoke)."""
    return f"{part / whole:.2f}" if whole > 0 else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=60, help="jobs (three children each) per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2 jobs, 1 round, 1 warm-up job: every path, quickly")
    args = parser.parse_args(argv)
    jobs, rounds, warm = (2, 1, 1) if args.smoke else (args.jobs, args.rounds, 5)
    template = children()
    with (
        tempfile.TemporaryDirectory(prefix="ftjob-write-cost-") as tmp,
        LocalCluster(Path(tmp) / "cluster", gpu_nodes=1) as cluster,
    ):
        kube = cluster.kube()
        install_crd(kube)
        kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        io = KubernetesClusterIO(api)
        variants: dict[str, Callable[[Obj], None]] = {
            "ClusterIO.apply (read+apply)": lambda o: io.apply([o], owner_uid=""),
            "apply, generated client": generated_apply(api),
            "apply, raw REST call": lambda o: raw(api, o, create=False),
            "create (POST), raw REST": lambda o: raw(api, o, create=True),
        }
        for v, write in enumerate(variants.values()):  # warm connections, caches and the apiserver's paths
            measure(template, write, f"warm-v{v}", warm)
        ratios: dict[str, list[str]] = {"client": [], "apiserver": [], "read": []}
        for r in range(rounds):
            print(f"round {r + 1}/{rounds} ({jobs} jobs each):", flush=True)
            got = {}
            for v, (name, write) in enumerate(variants.items()):
                got[name] = measure(template, write, f"r{r}v{v}", jobs)
                print(line(name, got[name]), flush=True)
            base = got["apply, generated client"]
            ratios["client"].append(ratio(got["apply, raw REST call"]["client"], base["client"]))
            ratios["apiserver"].append(ratio(got["create (POST), raw REST"]["kube-apiserver"], base["kube-apiserver"]))
            ratios["read"].append(ratio(got["ClusterIO.apply (read+apply)"]["client"], base["client"]))
        print("raw REST / generated client, writer CPU:  " + ", ".join(ratios["client"]))
        print("POST create / server-side apply, apiserver CPU: " + ", ".join(ratios["apiserver"]))
        print("ClusterIO.apply / one apply, writer CPU: " + ", ".join(ratios["read"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
