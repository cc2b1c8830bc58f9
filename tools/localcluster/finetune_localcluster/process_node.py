"""A test-only node agent that really runs the pods bound to its Node as local processes.

Why: kwok only pretends pods run. To test the contract between what the operator renders
(StatefulSet, env, volumes, headless Service, restart policy) and what the trainer expects
(hostnames that resolve, files at mount paths, `/dev/termination-log`, exit codes), the pods
must run for real. There is no container runtime here, so this agent plays a tiny kubelet:
the test venv's Python stands in for the image.

What it does for each pod bound to its Node (`spec.nodeName`):
- gives it an IP from this node's slice of 127.2.0.0/16 (`--pod-cidr`, e.g. 127.2.0.0/24);
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

It needs root (CAP_SYS_ADMIN) for `unshare --mount` and `mount --bind`.

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
import datetime as dt
import ipaddress
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import requests

from finetune_localcluster.cluster import (
    PROCESS_NODE_LABEL,
    PROCESS_NODE_TAINT,
    with_parent_death_signal,
)
from finetune_localcluster.kube import Kube, KubeError, Obj
from finetune_localcluster.kubelet_api import serve_logs
from finetune_localcluster.pod_contents import VENV_BIN, NotReadyYet, PodView, expand, hostname, hosts_file

POLL_S = 0.3
HEARTBEAT_S = 10.0
HOSTS_REFRESH_S = 1.0
MAX_GRACE_S = 30.0
MAX_MESSAGE = 4096


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    spec: Obj
    init: bool
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    next_start: float = 0.0
    started_at: str = ""
    started_mono: float = 0.0
    done: bool = False  # terminated and will not be restarted
    ready: bool = False
    probe_at: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])


@dataclass
class PodRun:
    pod: Obj
    dir: Path
    ip: str
    inits: list[Container]
    ctrs: list[Container]
    volumes: dict[str, Path] = field(default_factory=dict)
    prepared: bool = False
    error: str = ""
    kill_deadline: float | None = None
    sent: Obj | None = None
    cond_times: dict[str, tuple[str, str]] = field(default_factory=dict)
    start_time: str = field(default_factory=now)
    hosts_at: float = 0.0

    @property
    def meta(self) -> Obj:
        return dict(self.pod["metadata"])

    @property
    def spec(self) -> Obj:
        return dict(self.pod["spec"])

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.meta['namespace']}/pods/{self.meta['name']}"

    @property
    def hostname(self) -> str:
        return hostname(self.pod)


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
    def _conditions(self) -> list[Obj]:
        t = now()
        spec = [
            ("Ready", "True", "KubeletReady"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ]
        return [
            {
                "type": k,
                "status": s,
                "reason": r,
                "message": "process node",
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
            for k, s, r in spec
        ]

    def register(self) -> None:
        res = {
            "cpu": str(os.cpu_count() or 1),
            "memory": "64Gi",
            "pods": "110",
            "ephemeral-storage": "100Gi",
            "nvidia.com/gpu": str(self.gpus),
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    PROCESS_NODE_LABEL: "true",
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": self.gpu_product,
                    "nvidia.com/gpu.count": str(self.gpus),
                },
            },
            "spec": {
                "podCIDR": self.pod_cidr,
                "podCIDRs": [self.pod_cidr],
                "taints": [PROCESS_NODE_TAINT] if self.taint else [],
            },
            "status": {
                "capacity": res,
                "allocatable": res,
                "conditions": self._conditions(),
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "bootID": "",
                    "containerRuntimeVersion": "process://0",
                    "kernelVersion": os.uname().release,
                    "kubeProxyVersion": "",
                    "kubeletVersion": "v1.35.4",
                    "machineID": "",
                    "osImage": "finetune_localcluster process node",
                    "systemUUID": "",
                },
            },
        }
        try:
            self.kube.create("/api/v1/nodes", node)
        except KubeError as exc:
            if exc.status != 409:
                raise
            self.kube.merge_patch(f"/api/v1/nodes/{self.name}", {"metadata": node["metadata"]})
        self.heartbeat()

    def heartbeat(self) -> None:
        self._beat_at = time.monotonic()
        self.kube.merge_patch(
            f"/api/v1/nodes/{self.name}/status",
            {
                "status": {
                    "conditions": self._conditions(),
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
                }
            },
        )
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": 40,
            "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        try:
            self.kube.merge_patch(path, {"spec": spec})
        except KubeError as exc:
            if exc.status != 404:
                raise
            self.kube.create(path.rsplit("/", 1)[0], {"metadata": {"name": self.name}, "spec": spec})

    # -- main loop -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        server, self.kubelet_port = serve_logs(self.workdir / "pods")
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
        env = self.view(run).container_env(c.spec)
        cmd = [expand(a, env) for a in c.spec.get("command") or []]
        argv = cmd + [expand(a, env) for a in c.spec.get("args") or []]
        if not argv:
            raise NotReadyYet(f"container {c.name} has no command or args (images are not run here)")
        if "/" not in argv[0]:
            argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        elif not os.path.exists(argv[0]) and (VENV_BIN / Path(argv[0]).name).exists():
            argv[0] = str(VENV_BIN / Path(argv[0]).name)
        cdir = run.dir / "containers" / c.name
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / "termination-log").write_bytes(b"")
        mounts = [
            (run.dir / "hosts", "/etc/hosts", False),
            (cdir / "termination-log", c.spec.get("terminationMessagePath") or "/dev/termination-log", False),
        ]
        for m in c.spec.get("volumeMounts", []):
            src = run.volumes[m["name"]] / m.get("subPath", "")
            if m.get("subPath"):
                src.parent.mkdir(parents=True, exist_ok=True)
                if not src.exists():
                    src.mkdir()
            mounts.append((src, m["mountPath"], bool(m.get("readOnly"))))
        lines = ["set -e", f"hostname {shlex.quote(run.hostname[:63])}"]
        for src, dst, ro in mounts:
            q = shlex.quote(dst)
            lines.append(f"mkdir -p {q}" if src.is_dir() else f"mkdir -p $(dirname {q}); [ -e {q} ] || : > {q}")
            lines.append(f"mount --bind {shlex.quote(str(src))} {q}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {q}")
        workdir = c.spec.get("workingDir") or "/"
        lines += [f"mkdir -p {shlex.quote(workdir)}", f"cd {shlex.quote(workdir)}", 'exec "$@"']
        with open(run.dir / f"{c.name}.log", "ab") as log:
            c.proc = subprocess.Popen(
                with_parent_death_signal(
                    [
                        "unshare",
                        "--mount",
                        "--uts",
                        "--propagation",
                        "private",
                        "/bin/sh",
                        "-c",
                        "\n".join(lines),
                        "sh",
                        *argv,
                    ]
                ),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=run.dir,
                start_new_session=True,
            )
        if "terminated" in c.state:
            c.last_state, c.restarts = c.state, c.restarts + 1
        c.started_at, c.started_mono, c.probe_at, c.env = now(), time.monotonic(), 0.0, env
        c.state = {"running": {"startedAt": c.started_at}}
        c.ready = False

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
        p = c.spec.get("readinessProbe")
        if not p:
            return True
        t = time.monotonic()
        if t < c.probe_at or t - c.started_mono < p.get("initialDelaySeconds", 0):
            return c.ready
        c.probe_at = t + p.get("periodSeconds", 10)
        timeout = min(float(p.get("timeoutSeconds", 1)), 2.0)
        spec = p.get("tcpSocket") or p.get("httpGet") or {}
        port = spec.get("port", 0)
        if isinstance(port, str) and not port.isdigit():
            port = next((q["containerPort"] for q in c.spec.get("ports", []) if q.get("name") == port), 0)
        host = spec.get("host") or run.ip
        try:
            if "exec" in p and c.proc is not None:
                argv = ["nsenter", f"--target={c.proc.pid}", "--mount", "--uts", "--", *p["exec"]["command"]]
                done = subprocess.run(argv, check=False, env=c.env, timeout=timeout, capture_output=True)
                return done.returncode == 0
            if "tcpSocket" in p:
                socket.create_connection((host, int(port)), timeout=timeout).close()
                return True
            if "httpGet" in p:
                url = f"http://{host}:{int(port)}{spec.get('path', '/')}"
                return 200 <= requests.get(url, timeout=timeout, proxies={"http": ""}).status_code < 400
        except (OSError, subprocess.SubprocessError, requests.RequestException):
            return False
        return False

    # -- status ----------------------------------------------------------------------------
    def _cond(self, run: PodRun, kind: str, ok: bool) -> Obj:
        status = "True" if ok else "False"
        if run.cond_times.get(kind, ("", ""))[0] != status:
            run.cond_times[kind] = (status, now())
        return {"type": kind, "status": status, "lastTransitionTime": run.cond_times[kind][1]}

    def _ctr_status(self, run: PodRun, c: Container) -> Obj:
        state, last = c.state, c.last_state
        if run.error and "waiting" in state:
            state = {"waiting": {"reason": "ContainerCreating", "message": run.error}}
        elif "terminated" in state and not c.done:  # restart pending: back-off, as a kubelet shows it
            state, last = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting {c.name}"}}, state
        return {
            "name": c.name,
            "image": c.spec.get("image", ""),
            "imageID": "",
            "ready": c.ready,
            "started": "running" in state,
            "restartCount": c.restarts,
            "state": state,
            "lastState": last,
        }

    def report(self, run: PodRun) -> None:
        if run.pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        inits_ok = all(c.done and c.state["terminated"]["exitCode"] == 0 for c in run.inits)
        init_failed = any(c.done and c.state["terminated"]["exitCode"] != 0 for c in run.inits)
        if init_failed or (run.ctrs and all(c.done for c in run.ctrs)):
            bad = init_failed or any(c.state["terminated"]["exitCode"] != 0 for c in run.ctrs)
            phase = "Failed" if bad else "Succeeded"
        else:
            phase = "Running" if inits_ok and any(c.started_at for c in run.ctrs) else "Pending"
        ready = phase == "Running" and all(c.ready for c in run.ctrs)
        conditions = [
            self._cond(run, "PodReadyToStartContainers", run.prepared),
            self._cond(run, "Initialized", inits_ok),
            self._cond(run, "ContainersReady", ready),
            self._cond(run, "Ready", ready),
            self._cond(run, "PodScheduled", True),
        ]
        status = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": run.ip,
            "podIPs": [{"ip": run.ip}],
            "startTime": run.start_time,
            "containerStatuses": [self._ctr_status(run, c) for c in run.ctrs],
            "initContainerStatuses": [self._ctr_status(run, c) for c in run.inits],
        }
        if status != run.sent:
            self.kube.merge_patch(run.path + "/status", {"status": status})
            run.sent = status
        if phase in ("Succeeded", "Failed"):
            run.pod.setdefault("status", {})["phase"] = phase


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
    parser.add_argument("--pod-cidr", default="127.2.0.0/24")
    parser.add_argument("--pvc-root", type=Path, default=None)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-product", default="NVIDIA-A100-SXM4-80GB")
    parser.add_argument("--taint", action="store_true", help=f"taint the node {PROCESS_NODE_LABEL}=true:NoSchedule")
    args = parser.parse_args(argv)
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
