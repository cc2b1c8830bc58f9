"""A real Kubernetes control plane on loopback: etcd, apiserver, controllers, scheduler, nodes.

Why: an operator tested against mocks passes and then fails on a real cluster (a CRD that is
not structural, a CEL rule that does not compile, a missing RBAC verb, Pod Security rejecting
the pod). This starts the real binaries (built from Go modules by
`tools/build-kube-binaries.sh`) as plain processes, like controller-runtime's envtest, plus the
controller-manager, the scheduler, kwok-simulated GPU nodes, optional process nodes that
really run pods (`process_node.py`), and a default StorageClass whose claims a local-path
provisioner binds (`local_provisioner.py`).

Design notes:
- Every listener is on 127.0.0.1 with a free port, so parallel clusters do not collide. Fake
  pod IPs stay in 127.0.0.0/8 (kwok: 127.1.0.0/16, process nodes: a /24 of
  127.2.0.0/16 each, which no other cluster's process node on this machine holds). The
  service range is 127.3.0.0/24 (loopback, accepted by the apiserver): nothing here runs
  kube-proxy, so ClusterIPs are only allocated, never contacted.
- Every process is started in its own session and recorded (pid and argv[0]) in
  `<workdir>/cluster.json`, so `down` (even from another process, e.g. the CLI) stops exactly
  those pids: SIGTERM, then SIGKILL after a bounded wait, after checking that the pid still
  runs the same binary. Unless `detach=True`, children are started through
  `setpriv --pdeathsig=KILL` so a killed test run does not leave an apiserver behind (KILL,
  not TERM: a gracefully stopping apiserver whose etcd died with it waits a long time). The
  death signal follows the *thread* that called `up()`: call it from a long-lived thread.
- Every wait is bounded; a startup failure raises `ClusterError` with the tail of the failing
  component's log, after stopping whatever was already started.
- A control-plane component that exits by itself is started again, as the kubelet restarts a
  static pod (unless `detach=True`: then nothing outlives the call to watch it). This is not
  a nicety: kube-scheduler exits on purpose when it finds its cache corrupted, which a binding
  left unconfirmed by an apiserver outage can cause; without a restart no pod is scheduled again.
- The controller-manager waits `NODE_MONITOR_GRACE` (not Kubernetes' 40 s) for a node's
  heartbeat before it marks the node lost. kwok and the process nodes share two cores with the
  tests, and at a load of 10 kwok's heartbeat came over 40 s late: the node lifecycle controller
  then set every pod of the node Ready=False, which kwok never sets back (a real kubelet
  would), and a test waited forever for a Ready pod. Nothing here tests node loss.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import requests
import yaml

from finetune_localcluster import kueue
from finetune_localcluster.binaries import Binaries, ensure_binaries
from finetune_localcluster.kube import Kube, Obj
from finetune_localcluster.pki import Pki, make_pki
from finetune_localcluster.ports import free_port

SERVICE_CIDR = "127.3.0.0/24"
SERVICE_IP = "127.3.0.1"
KWOK_POD_CIDR = "127.1.0.0/16"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
PROCESS_NODE_LABEL = "finetune.dev/process-node"
PROCESS_NODE_TAINT = {"key": PROCESS_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
# Pod spec fields that put a pod on a process node (merge into a pod spec or template spec).
PROCESS_NODE_PLACEMENT: Obj = {
    "nodeSelector": {PROCESS_NODE_LABEL: "true"},
    "tolerations": [{"key": PROCESS_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
}
KWOK_NODE_SELECTOR = {"type": "kwok"}
KWOK_STAGE_FILES = [
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
]
STOP_TIMEOUT_S = 10.0
SUPERVISED = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kueue", "local-provisioner"
)  # fmt: skip
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
NODE_MONITOR_GRACE = "10m"
"""Waits before each further restart of one component (the kubelet's back-off, shortened)."""


class ClusterError(RuntimeError):
    """The local cluster could not be started (the message includes the component's log)."""


def with_parent_death_signal(argv: list[str], sig: str = "KILL") -> list[str]:
    """Prefix argv so the process gets `sig` when the thread that started it dies."""
    setpriv = shutil.which("setpriv")
    return [setpriv, f"--pdeathsig={sig}", *argv] if setpriv else argv


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _cmdline0(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return None
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def gpu_node_manifest(name: str, gpus: int, gpu_product: str, gpu_memory_mib: int = 81920) -> Obj:
    """A Node object for kwok to manage: fake GPUs in capacity and allocatable."""
    resources = {
        "cpu": "96",
        "memory": "1024Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": gpu_product,
                "nvidia.com/gpu.count": str(gpus),
                # GPU Feature Discovery's memory label (MiB), which GPU jobs' node affinity reads
                "nvidia.com/gpu.memory": str(gpu_memory_mib),
            },
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


class LocalCluster:
    """One local cluster. Use `up()`/`down()` or `with LocalCluster(...) as c:`."""

    def __init__(
        self,
        workdir: Path | str | None = None,
        *,
        gpu_nodes: int = 2,
        process_nodes: int = 0,
        gpus_per_node: int = 8,
        gpu_product: str = "NVIDIA-A100-SXM4-80GB",
        taint_process_nodes: bool = True,
        detach: bool = False,
        keep_workdir: bool = False,
        binaries: Binaries | None = None,
        startup_timeout_s: float = 120.0,
        kueue: bool = False,
    ) -> None:
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ftjob-cluster-"))
        self.gpu_nodes = gpu_nodes
        self.process_nodes = process_nodes
        self.gpus_per_node = gpus_per_node
        self.gpu_product = gpu_product
        self.taint_process_nodes = taint_process_nodes
        self.detach = detach
        self.keep_workdir = keep_workdir
        self.binaries = binaries
        self.timeout = startup_timeout_s
        self.kueue = kueue
        self.procs: list[dict[str, Any]] = []
        self._popens: dict[int, subprocess.Popen[bytes]] = {}
        self.server = ""
        self.restarts: dict[str, int] = {}
        """Restarts of each component after it exited by itself (not those asked by `restart`)."""
        self._procs_lock = threading.RLock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    # -- public API ------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.workdir / "cluster.json"

    def kube(self) -> Kube:
        return Kube(self.kubeconfig)

    def node_names(self) -> tuple[list[str], list[str]]:
        """(kwok GPU node names, process node names)."""
        return (
            [f"kwok-gpu-{i}" for i in range(self.gpu_nodes)],
            [f"process-node-{i}" for i in range(self.process_nodes)],
        )

    def env(self) -> dict[str, str]:
        """Environment for tools (kubectl, helm) pointed at this cluster."""
        bins = self.binaries or ensure_binaries()
        path = os.pathsep.join([str(bins.kube_bin), str(bins.helm.parent), os.environ.get("PATH", "")])
        return {"KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def up(self) -> Self:
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every recorded process (newest first), by pid, then remove the work dir."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=60)
        with self._procs_lock:
            for proc in reversed(self.procs):
                self._stop(proc)
            self.procs = []
        if self.workdir.exists() and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        elif self.workdir.exists():
            self._save_state()

    def restart(self, name: str, down_s: float = 0.0) -> None:
        """Stop one component (`etcd`, `kube-apiserver`, ...) by pid, keep it down `down_s`
        seconds, and start it again with the same arguments (same ports, same etcd data);
        returns once it answers again. For tests of what survives a control-plane restart."""
        with self._procs_lock:  # the supervisor must not take this stop for a crash
            proc = next(p for p in self.procs if p["name"] == name)
            self._stop(proc)
            self.procs.remove(proc)
        time.sleep(down_s)
        with self._procs_lock:
            restarted = self._start(name, list(proc["argv"]))
        cert = (str(self.workdir / "pki" / "admin.crt"), str(self.workdir / "pki" / "admin.key"))
        checks: dict[str, Callable[[], bool]] = {
            "etcd": lambda: any(
                _get(f"{arg.split('=', 1)[1]}/health").json().get("health") == "true"
                for arg in proc["argv"]
                if arg.startswith("--listen-client-urls=")
            ),
            "kube-apiserver": lambda: (
                _get(f"{self.server}/readyz", cert=cert, verify=str(self.workdir / "pki" / "ca.crt")).ok
            ),
        }
        if name in checks:
            self._wait(f"{name} to answer again", checks[name], restarted)

    @classmethod
    def attach(cls, workdir: Path | str) -> LocalCluster:
        """The cluster recorded in `workdir` (to stop it from another process)."""
        cluster = cls(workdir=workdir)
        state = json.loads(cluster.state_file.read_text())
        cluster.procs = state["procs"]
        cluster.server = state["server"]
        cluster.gpu_nodes, cluster.process_nodes = state["gpu_nodes"], state["process_nodes"]
        return cluster

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.down()

    # -- startup ---------------------------------------------------------------------------
    def _up(self) -> None:
        bins = self.binaries = self.binaries or ensure_binaries(kueue=self.kueue)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        pki = make_pki(self.workdir / "pki", SERVICE_IP)

        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._start(
            "etcd",
            [
                str(bins.etcd),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: _get(f"{etcd_url}/health").json().get("health") == "true", etcd)

        api_port = free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self._write_kubeconfig(pki)
        apiserver = self._start(
            "kube-apiserver",
            [
                str(bins.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={self.workdir / 'apiserver'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--enable-admission-plugins=PodSecurity",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
            ],
        )
        cert = (str(pki.admin_cert), str(pki.admin_key))
        self._wait(
            "kube-apiserver /readyz",
            lambda: _get(f"{self.server}/readyz", cert=cert, verify=str(pki.ca_cert)).ok,
            apiserver,
        )

        kc = str(self.kubeconfig)
        common = [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
        ]
        kcm_port, sched_port = free_port(), free_port()
        kcm = self._start(
            "kube-controller-manager",
            [
                str(bins.kube_controller_manager),
                *common,
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.workdir / 'kcm'}",
                "--controllers=*",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                "--use-service-account-credentials=false",
                "--profiling=false",
            ],
        )
        sched = self._start(
            "kube-scheduler",
            [
                str(bins.kube_scheduler),
                *common,
                f"--secure-port={sched_port}",
                f"--cert-dir={self.workdir / 'scheduler'}",
                "--profiling=false",
            ],
        )
        for proc, port in ((kcm, kcm_port), (sched, sched_port)):
            url = f"https://127.0.0.1:{port}/healthz"
            self._wait(f"{proc['name']} /healthz", lambda u=url: _get(u, verify=False).ok, proc)  # type: ignore[misc]

        kube = self.kube()
        try:
            kwok_names, process_names = self.node_names()
            for name in kwok_names:
                kube.create("/api/v1/nodes", gpu_node_manifest(name, self.gpus_per_node, self.gpu_product))
            if kwok_names:
                self._start_kwok(bins)
            for name in process_names:
                argv = [
                    sys.executable,
                    "-m",
                    "finetune_localcluster.process_node",
                    f"--kubeconfig={kc}",
                    f"--name={name}",
                    f"--workdir={self.workdir / name}",
                    f"--gpus={self.gpus_per_node}",
                    f"--gpu-product={self.gpu_product}",
                ]
                self._start(name, argv + (["--taint"] if self.taint_process_nodes else []))
            self._wait("nodes Ready", lambda: self._nodes_ready(kube, kwok_names + process_names), None)
            self._start_provisioner(kube)
            if self.kueue:
                self._start_kueue(bins, kube)
        finally:
            kube.close()
        self._save_state()
        if not self.detach:
            self._supervisor = threading.Thread(target=self._supervise, name="local-cluster-supervisor", daemon=True)
            self._supervisor.start()

    def _supervise(self) -> None:
        """Start again, with the same arguments, every supervised component that exited by itself,
        waiting `RESTART_BACKOFF_S` between the restarts of one component. Processes are started
        from this thread: their death signal (see the module notes) follows it, and it lives until
        `down`."""
        not_before: dict[str, float] = {}
        while not self._stopping.wait(0.5):
            with self._procs_lock:
                for proc in list(self.procs):
                    name, popen = proc["name"], self._popens.get(proc["pid"])
                    if name not in SUPERVISED or popen is None or popen.poll() is None:
                        continue
                    if time.monotonic() < not_before.get(name, 0.0):
                        continue
                    count = self.restarts.get(name, 0)
                    note = f"--- {name} exited with {popen.returncode}; restart {count + 1} by the local cluster"
                    with open(proc["log"], "a") as log:
                        log.write(f"\n{note}\n")
                    self._popens.pop(proc["pid"], None)
                    self.procs.remove(proc)
                    self._start(name, list(proc["argv"]))
                    self.restarts[name] = count + 1
                    not_before[name] = time.monotonic() + RESTART_BACKOFF_S[min(count, len(RESTART_BACKOFF_S) - 1)]

    def _start_kwok(self, bins: Binaries) -> None:
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text("\n---\n".join((bins.kwok_stages / f).read_text() for f in KWOK_STAGE_FILES))
        self._start(
            "kwok",
            [
                str(bins.kwok),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--cidr={KWOK_POD_CIDR}",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _start_provisioner(self, kube: Kube) -> None:
        """The default StorageClass and its provisioner (`local_provisioner.py`): claims get volumes."""
        from finetune_localcluster.local_provisioner import apply_storage_class

        apply_storage_class(kube)
        self._start(
            "local-provisioner",
            [
                sys.executable,
                "-m",
                "finetune_localcluster.local_provisioner",
                f"--kubeconfig={self.kubeconfig}",
                f"--pvc-root={self.workdir / 'pvc'}",
            ],
        )

    def _start_kueue(self, bins: Binaries, kube: Kube) -> None:
        """Kueue's CRDs and webhooks, then its controller (see `kueue.py` for how webhooks reach it)."""
        port = free_port()
        host = kueue.install(kube, bins, port)
        workdir = self.workdir / "kueue"
        workdir.mkdir(exist_ok=True)
        health = free_port()
        config = kueue.configuration(
            host, port, workdir, health_port=health, metrics_port=free_port(), visibility_port=free_port()
        )
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
        proc = self._start(
            "kueue",
            [
                str(bins.kueue),
                f"--config={workdir / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
            ],
        )
        self._wait("kueue's webhook certs", lambda: kueue.mount_certs(kube, workdir / "certs"), proc)
        self._wait("kueue /readyz", lambda: _get(f"http://127.0.0.1:{health}/readyz").ok, proc)
        self._wait("kueue webhooks", lambda: kueue.admits_objects(kube), proc)

    def _nodes_ready(self, kube: Kube, names: list[str]) -> bool:
        for proc in self.procs:
            if proc["name"] in ("kwok", *names) and _cmdline0(proc["pid"]) is None:
                raise ClusterError(f"{proc['name']} exited during startup:\n{_tail(Path(proc['log']))}")
        nodes = {n["metadata"]["name"]: n for n in kube.items("/api/v1/nodes")}
        for name in names:
            node = nodes.get(name)
            if node is None:
                return False
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            taints = node.get("spec", {}).get("taints", [])
            if conds.get("Ready") != "True" or any(t["key"].startswith("node.kubernetes.io/") for t in taints):
                return False
        return True

    def _write_kubeconfig(self, pki: Pki) -> None:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "local",
            "clusters": [
                {"name": "local", "cluster": {"server": self.server, "certificate-authority": str(pki.ca_cert)}}
            ],
            "users": [
                {"name": "admin", "user": {"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)}}
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))
        self.kubeconfig.chmod(0o600)

    # -- processes -------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> dict[str, Any]:
        log = self.workdir / "logs" / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv if self.detach else with_parent_death_signal(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        self._popens[popen.pid] = popen
        proc = {"name": name, "pid": popen.pid, "argv0": argv[0], "argv": argv, "log": str(log)}
        self.procs.append(proc)
        self._save_state()
        return proc

    def _stop(self, proc: dict[str, Any]) -> None:
        pid: int = proc["pid"]
        popen = self._popens.pop(pid, None)

        def gone() -> bool:
            if popen is not None:
                return popen.poll() is not None
            return _cmdline0(pid) != str(proc["argv0"])

        if gone():
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if gone():
                    return
                time.sleep(0.1)

    def _restarts_it(self, proc: dict[str, Any]) -> bool:
        """Whether the supervisor (running once the cluster is up) will start `proc` again."""
        return self._supervisor is not None and not self._stopping.is_set() and proc["name"] in SUPERVISED

    def _wait(self, what: str, check: Callable[[], bool], proc: dict[str, Any] | None) -> None:
        deadline = time.monotonic() + self.timeout
        last = ""
        while time.monotonic() < deadline:
            if proc is not None:
                if proc["pid"] not in self._popens:
                    # The supervisor saw it exit and started it again (a component restarted
                    # under load can die once more): follow the new process.
                    with self._procs_lock:
                        proc = next((p for p in self.procs if p["name"] == proc["name"]), proc)
                popen = self._popens.get(proc["pid"])
                if popen is not None and popen.poll() is not None and not self._restarts_it(proc):
                    raise ClusterError(
                        f"{proc['name']} exited while waiting for {what}; log tail:\n{_tail(Path(proc['log']))}"
                    )
            try:
                if check() is True:
                    return
            except ClusterError:
                raise
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        tail = f"; {proc['name']} log tail:\n{_tail(Path(proc['log']))}" if proc else ""
        raise ClusterError(f"timed out after {self.timeout:.0f}s waiting for {what} ({last}){tail}")

    def _save_state(self) -> None:
        if self.workdir.exists():
            self.state_file.write_text(
                json.dumps(
                    {
                        "procs": self.procs,
                        "server": self.server,
                        "kubeconfig": str(self.kubeconfig),
                        "gpu_nodes": self.gpu_nodes,
                        "process_nodes": self.process_nodes,
                    },
                    indent=1,
                )
            )


def _get(url: str, **kwargs: Any) -> requests.Response:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return requests.get(url, timeout=3, proxies={"http": "", "https": ""}, **kwargs)
