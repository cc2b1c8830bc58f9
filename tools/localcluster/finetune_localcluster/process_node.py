"""A test-only node agent that really runs the pods bound to its Node as local processes.

Why: kwok only pretends pods run. To test the contract between what the operator renders
(StatefulSet, env, volumes, headless Service, restart policy) and what the trainer expects
(hostnames that resolve, files at mount paths, `/dev/termination-log`, exit codes), the pods
must run for real. There is no container runtime here, so this agent plays a tiny kubelet:
the test venv's Python stands in for the image.

What it does for each pod bound to its Node (`spec.nodeName`):
- gives it an IP from this node's slice of 127.2.0.0/16 (`--pod-cidr`, e.g. 127.2.0.0/24; by
  default a /24 no other process node on this machine holds, see `pod_cidr.py`);
  processes share the host network namespace, and every 127.x address is on `lo`;
- materialises volumes into `<workdir>/pods/<ns>_<name>_<uid>/volumes/<volume>`: configMap,
  secret, projected (configMap/secret sources), downwardAPI (fieldRef items), emptyDir
  (`medium: Memory` under /dev/shm), persistentVolumeClaim (a directory per claim under
  `--pvc-root`, shared by every pod and process node of the cluster) and hostPath;
- writes an /etc/hosts with `<hostname>.<subdomain>.<ns>.svc[.cluster.local]` of every pod in
  the namespace that has a subdomain and an IP (refreshed every second, in place);
- starts each container as `unshare --mount --uts` + a small shell that sets the hostname,
  bind-mounts the volumes, /etc/hosts and the termination-message file at their paths
  (mount points that do not exist are created, empty, on the host) and execs the command;
  env comes from the spec (value, fieldRef, configMapKeyRef, secretKeyRef, envFrom) with
  `$(VAR)` expansion; command[0] is looked up in the venv's bin dir first;
- runs init containers in order, then the containers; restartPolicy Always/OnFailure/Never
  with restart counts and a short exponential back-off (0.5 s doubling to 10 s);
- reports phase, podIP, conditions and container states (running, or terminated with
  exitCode, reason Completed/Error, message from the termination file or, with
  FallbackToLogsOnError and a failure, the log tail) into pod status;
- readiness: Ready while running, gated by an exec, tcpSocket or httpGet readinessProbe;
- on deletion: SIGTERM to each container's process group, SIGKILL after the grace period,
  then deletes the pod object with grace 0 (as a kubelet does). On shutdown it stops all,
  and every container gets `setpriv --pdeathsig=KILL`, so none outlives a killed agent.

It needs root (CAP_SYS_ADMIN) for `unshare --mount` and `mount --bind`. This module is the
agent's loop and the pods' lifecycle; the Node object (`node_object.py`), starting a container
(`container_launch.py`), readiness probes (`probes.py`) and the reported pod status
(`pod_status.py`) live beside it.

Not supported (by design, it is a test tool): images (any image name is accepted and
ignored), securityContext (processes run as root; the apiserver's Pod Security admission
still validates the spec), resource limits, liveness/startup probes, sidecar init
containers, ephemeral containers, ports/hostNetwork isolation, serviceAccountToken
projections, volume content updates after start, `kubectl exec`/`port-forward`.
`kubectl logs` works (kubelet_api.py serves the per-container log files).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import requests

from finetune_localcluster import pod_cidr
from finetune_localcluster.cluster import (
    PROCESS_NODE_LABEL,
)
from finetune_localcluster.container_launch import launch
from finetune_localcluster.kube import Kube, KubeError, Obj
from finetune_localcluster.kubelet_api import serve_logs
from finetune_localcluster.node_object import heartbeat, register
from finetune_localcluster.pod_contents import NotReadyYet, PodView, hosts_file
from finetune_localcluster.pod_runs import Container, PodRun, now
from finetune_localcluster.pod_status import pod_status
from finetune_localcluster.probes import probe

POLL_S = 0.3
HEARTBEAT_S = 10.0
HOSTS_REFRESH_S = 1.0
MAX_GRACE_S = 120.0
"""The most of a pod's grace period honoured: trainer pods get one sized for a checkpoint save
(at least 60 s), which their ranks use when preempted; a container that exits on SIGTERM ends sooner."""
MAX_MESSAGE = 4096


class ProcessNode:
    """The agent. `run(stop)` registers the Node and syncs pods until `stop` is set."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        *,
        workdir: Path,
        pod_cidr: str,
        pvc_root: Path,
        gpus: int = 8,
        gpu_product: str = "NVIDIA-A100-SXM4-80GB",
        taint: bool = True,
    ) -> None:
        self.kube, self.name, self.workdir, self.pvc_root = kube, name, workdir, pvc_root
        self.pod_cidr, self.gpus, self.gpu_product, self.taint = pod_cidr, gpus, gpu_product, taint
        self.free_ips = [str(ip) for ip in ipaddress.ip_network(pod_cidr).hosts()]
        self.pods: dict[str, PodRun] = {}
        self._ns_pods: dict[str, list[Obj]] = {}
        self._beat_at = 0.0
        self.kubelet_port = 0

    # -- node ------------------------------------------------------------------------------
    def register(self) -> None:
        register(
            self.kube,
            self.name,
            pod_cidr=self.pod_cidr,
            gpus=self.gpus,
            gpu_product=self.gpu_product,
            taint=self.taint,
            kubelet_port=self.kubelet_port,
        )
        self._beat_at = time.monotonic()

    def heartbeat(self) -> None:
        self._beat_at = time.monotonic()
        heartbeat(self.kube, self.name, self.kubelet_port)

    # -- main loop -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        server, self.kubelet_port = serve_logs(self.workdir / "pods", self.container_running)
        self.register()
        while not stop.is_set():
            try:
                self.sync()
                if time.monotonic() - self._beat_at > HEARTBEAT_S:
                    self.heartbeat()
            except (KubeError, requests.RequestException, OSError):
                traceback.print_exc()
            stop.wait(POLL_S)
        server.shutdown()
        self.shutdown()

    def container_running(self, pod_dir: Path, container: str) -> bool:
        """Whether `container` of the pod kept in `pod_dir` has a live process (the log server's
        thread asks; a container that exited, a pod stopped or forgotten, is not running)."""
        for run in list(self.pods.values()):
            if run.dir == pod_dir:
                proc = next((c.proc for c in run.inits + run.ctrs if c.name == container), None)
                return proc is not None and proc.poll() is None
        return False

    def sync(self) -> None:
        self._ns_pods = {}
        seen = set()
        for pod in self.kube.items("/api/v1/pods", fieldSelector=f"spec.nodeName={self.name}"):
            uid, meta = pod["metadata"]["uid"], pod["metadata"]
            seen.add(uid)
            run = self.pods.get(uid)
            if run is None:
                if meta.get("deletionTimestamp"):
                    self._delete_object(pod)
                    continue
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                run = self.pods[uid] = self.admit(pod)
            run.pod = pod
            if meta.get("deletionTimestamp"):
                self.terminate(run)
                continue
            try:
                self.step(run)
            except (KeyError, TypeError, ValueError) as exc:  # a spec this agent cannot handle
                traceback.print_exc()
                run.error = f"process node: {type(exc).__name__}: {exc}"
            self.report(run)
        for uid in list(self.pods):
            if uid not in seen:
                self.forget(self.pods[uid], grace=0)

    def shutdown(self) -> None:
        for run in list(self.pods.values()):
            self.forget(run, grace=5)
        self.kube.close()

    # -- pods ------------------------------------------------------------------------------
    def admit(self, pod: Obj) -> PodRun:
        meta, spec = pod["metadata"], pod["spec"]
        pod_dir = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        print(f"admit {meta['namespace']}/{meta['name']} in {pod_dir}", flush=True)
        return PodRun(
            pod=pod,
            dir=pod_dir,
            ip=self.free_ips.pop(0),
            inits=[Container(c, True) for c in spec.get("initContainers", [])],
            ctrs=[Container(c, False) for c in spec["containers"]],
        )

    def terminate(self, run: PodRun) -> None:
        """Graceful deletion: SIGTERM now, SIGKILL at the deadline, then delete the object."""
        procs = [c.proc for c in run.inits + run.ctrs if c.proc is not None]
        if run.kill_deadline is None:
            grace = run.meta.get("deletionGracePeriodSeconds")
            run.kill_deadline = time.monotonic() + min(float(30 if grace is None else grace), MAX_GRACE_S)
            for p in procs:
                _signal(p, signal.SIGTERM)
        if all(p.poll() is not None for p in procs) or time.monotonic() >= run.kill_deadline:
            self.forget(run, grace=0)
            self._delete_object(run.pod)

    def forget(self, run: PodRun, grace: float) -> None:
        for c in run.inits + run.ctrs:
            if c.proc is not None:
                _stop(c.proc, grace)
                c.proc = None
        for path in run.volumes.values():
            if str(path).startswith("/dev/shm/ftjob-"):
                shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(run.dir / "volumes", ignore_errors=True)
        self.pods.pop(run.meta["uid"], None)
        self.free_ips.append(run.ip)

    def _delete_object(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(KubeError):
            self.kube.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )

    def step(self, run: PodRun) -> None:
        if run.kill_deadline is not None or run.pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        try:
            if not run.prepared:
                self.prepare(run)
            self.write_hosts(run)
        except NotReadyYet as exc:
            run.error = str(exc)
            return
        run.error = ""
        policy = run.spec.get("restartPolicy", "Always")
        for c in run.inits:
            if not c.done:
                self.drive(run, c, "Never" if policy == "Never" else "OnFailure")
                if not (c.done and c.state.get("terminated", {}).get("exitCode") == 0):
                    return
        for c in run.ctrs:
            self.drive(run, c, policy)

    def drive(self, run: PodRun, c: Container, policy: str) -> None:
        if c.proc is not None:
            rc = c.proc.poll()
            if rc is None:
                c.ready = self.probe(run, c)
                return
            self.finished(run, c, rc, policy)
        if c.done or time.monotonic() < c.next_start:
            return
        try:
            self.start(run, c)
        except NotReadyYet as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 1.0

    def finished(self, run: PodRun, c: Container, rc: int, policy: str) -> None:
        code = rc if rc >= 0 else 128 - rc
        term: Obj = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.started_at,
            "finishedAt": now(),
            "containerID": f"process://{c.proc.pid if c.proc else 0}",
        }
        message = (run.dir / "containers" / c.name / "termination-log").read_bytes()[:MAX_MESSAGE]
        if not message.strip() and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = b"\n".join((run.dir / f"{c.name}.log").read_bytes().splitlines()[-80:])[-2048:]
        if message:
            term["message"] = message.decode(errors="replace")
        c.proc, c.ready = None, False
        c.state = {"terminated": term}
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            c.next_start = time.monotonic() + min(0.5 * 2**c.restarts, 10.0)
        else:
            c.done = True
        print(f"{run.meta['name']}/{c.name} exited {code}", flush=True)

    def start(self, run: PodRun, c: Container) -> None:
        launch(run, c, self.view(run).container_env(c.spec))

    # -- pod contents ----------------------------------------------------------------------
    def view(self, run: PodRun) -> PodView:
        return PodView(self.kube, run.pod, run.ip, self.name)

    def prepare(self, run: PodRun) -> None:
        run.volumes = self.view(run).volumes(run.dir / "volumes", self.pvc_root)
        (run.dir / "hosts").touch()
        run.prepared = True

    def write_hosts(self, run: PodRun) -> None:
        if time.monotonic() - run.hosts_at < HOSTS_REFRESH_S:
            return
        run.hosts_at = time.monotonic()
        ns = run.meta["namespace"]
        if ns not in self._ns_pods:
            self._ns_pods[ns] = self.kube.items(f"/api/v1/namespaces/{ns}/pods")
        content = hosts_file(run.pod, run.ip, self._ns_pods[ns])
        hosts = run.dir / "hosts"
        if hosts.read_text() != content:
            with open(hosts, "r+") as f:  # in place: the file is bind-mounted by inode
                f.write(content)
                f.truncate()

    def probe(self, run: PodRun, c: Container) -> bool:
        return probe(run, c)

    # -- status ----------------------------------------------------------------------------
    def report(self, run: PodRun) -> None:
        if run.pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        status = pod_status(run)
        if status != run.sent:
            self.kube.merge_patch(run.path + "/status", {"status": status})
            run.sent = status
        if status["phase"] in ("Succeeded", "Failed"):
            run.pod.setdefault("status", {})["phase"] = status["phase"]


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the container's process group, SIGKILL after `grace` seconds; bounded."""
    if proc.poll() is not None:
        return
    _signal(proc, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    try:
        proc.wait(timeout=max(grace, 0.1))
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="test-only node agent that runs pods as processes")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--pod-cidr", default=None, help="default: a free /24 of 127.2.0.0/16, held while running")
    parser.add_argument("--pvc-root", type=Path, default=None)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-product", default="NVIDIA-A100-SXM4-80GB")
    parser.add_argument("--taint", action="store_true", help=f"taint the node {PROCESS_NODE_LABEL}=true:NoSchedule")
    args = parser.parse_args(argv)
    if args.pod_cidr is None:
        args.pod_cidr, _held = pod_cidr.claim()  # the lock lives as long as this process
    if not ipaddress.IPv4Network(args.pod_cidr).subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
        parser.error("--pod-cidr must be inside 127.0.0.0/8")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    args.workdir.mkdir(parents=True, exist_ok=True)
    node = ProcessNode(
        Kube(args.kubeconfig),
        args.name,
        workdir=args.workdir,
        pod_cidr=args.pod_cidr,
        pvc_root=args.pvc_root or args.workdir.parent / "pvc",
        gpus=args.gpus,
        gpu_product=args.gpu_product,
        taint=args.taint,
    )
    node.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
