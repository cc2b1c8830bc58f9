"""Driving the operator and the chart on a LocalCluster: shared by the tests and the demo.

Runs `ftjob operator` as a separate process (as it runs in a pod), installs the generated
CRD, binds a claim for a job's output, runs helm and kubectl from the cached binaries,
and makes a kubeconfig from a ServiceAccount token so the operator can run with exactly
the chart's RBAC.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from finetune_localcluster.binaries import cached_binaries
from finetune_localcluster.cluster import LocalCluster
from finetune_localcluster.kube import Kube, wait_for
from finetune_localcluster.ports import free_port

REPO = Path(__file__).resolve().parents[3]


def install_crd(kube: Kube) -> None:
    from finetune_operator.api.crdgen import build_crd

    manifest = build_crd()
    name = manifest["metadata"]["name"]
    kube.request(
        "PATCH",
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
        manifest,
        params={"fieldManager": "tests", "force": "true"},
        content_type="application/apply-patch+yaml",
    )

    def established() -> bool:
        got = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (got.get("status") or {}).get("conditions") or []
        )

    wait_for(established, 30, "the FineTuneJob CRD to be established")


@dataclass
class OperatorProcess:
    """A running `ftjob operator`, restartable (to test restarts mid-flight)."""

    kubeconfig: Path
    log_path: Path
    extra_args: tuple[str, ...] = ()
    unset_env: tuple[str, ...] = ()
    """Environment variables of the test run the operator must not inherit (e.g. HF_HUB_OFFLINE)."""
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    master_port: int = 0
    """Rank 0's rendezvous port in the pods, chosen once (a restart keeps the rendered pods'):
    the process node gives pods their own loopback IPs but no network namespace, and torch's
    TCPStore listens on every address, so two clusters on one machine must not share 29500."""

    def start(self) -> None:
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.master_port = self.master_port or free_port()
        argv = [
            str(REPO / ".venv" / "bin" / "ftjob") if (REPO / ".venv/bin/ftjob").exists() else "ftjob",
            "operator",
            "--kubeconfig", str(self.kubeconfig),
            "--metrics-address", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            "--interval", "1",
            "--trainer-image", "trainer:test",
            "--master-port", str(self.master_port),
            *self.extra_args,
        ]  # fmt: skip
        log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if k not in self.unset_env}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        # 180 s: the operator imports ~3.8 CPU-s of modules before it serves /healthz, and at load 20
        # (CI's four lanes on 2 cores) a process gets about a tenth of a core; 60 s ran out there, the
        # chaos test's restarts failed one after another and no life reached its work
        wait_for(self._healthy, 180, "the operator's liveness endpoint")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        return bool(self.health())  # kopf answers with its probes by id: {} only while it does not answer

    def health(self) -> dict[str, Any]:
        """What the operator's /healthz says now: kopf's probes by id (`reconciler`: the jobs it
        holds, the passes due and running); {} while it does not answer."""
        try:
            reply = requests.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2)
            body = reply.json() if reply.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def metrics(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def bind_claim(kube: Kube, namespace: str, claim: str) -> None:
    """A statically bound claim (the process node keeps its data in a directory per claim)."""
    pv = f"{namespace}-{claim}"[:63]
    kube.create("/api/v1/persistentvolumes", {
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": f"/tmp/{pv}"}, "claimRef": {"namespace": namespace, "name": claim}},
    })  # fmt: skip
    kube.create(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    wait_for(
        lambda: (
            kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")["status"].get("phase") == "Bound"
        ),
        60,
        "the output claim to bind",
    )


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(cached_binaries().kubectl), "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def helm(kubeconfig: Path, *args: str) -> str:
    done = subprocess.run(
        [str(cached_binaries().helm), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def service_account_kubeconfig(kube: Kube, cluster: LocalCluster, ns: str, sa: str, path: Path) -> Path:
    token = kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                        {"spec": {"expirationSeconds": 3600}})["status"]["token"]  # fmt: skip
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa}}],
        "current-context": sa,
    }
    path.write_text(yaml.safe_dump(config))
    return path
