"""Debian's `prometheus` on loopback for the Prometheus tier, and a real `ftjob operator` process.

Prometheus gets a free port, a temporary storage folder and a 1 s scrape interval; its
targets are static, with the labels the chart's PodMonitor would add (namespace,
finetune_job) set as static labels. Whoever starts one stops it by pid (`stop()`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster.ports import free_port
from tests.support.training_runs import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def free_port_pair() -> int:
    """A port p with p and p + 1 free (a 2-rank trainer serves on base + local rank)."""
    import socket

    for _ in range(50):
        base = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise RuntimeError("no two consecutive free ports")


@dataclass
class TrainerTarget:
    finetune_job: str
    base_port: int
    ranks: int = 2

    def targets(self) -> list[str]:
        return [f"127.0.0.1:{self.base_port + r}" for r in range(self.ranks)]


def scrape_config(
    namespace: str,
    trainers: list[TrainerTarget],
    operator_port: int,
    rule_files: tuple[Path, ...] = (),
    operator_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Prometheus' configuration: the trainers with the PodMonitor's labels, the operator (with
    `operator_labels`, e.g. the namespace a ServiceMonitor's target carries) and any rule files."""
    operator_target: dict[str, Any] = {"targets": [f"127.0.0.1:{operator_port}"]}
    if operator_labels:
        operator_target["labels"] = dict(operator_labels)
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "finetune-trainer",
                "static_configs": [
                    {"targets": t.targets(), "labels": {"namespace": namespace, "finetune_job": t.finetune_job}}
                    for t in trainers
                ],
            },
            {"job_name": "finetune-operator", "honor_labels": True, "static_configs": [operator_target]},
        ],
    }
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    return config


class PrometheusServer:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.storage = workdir / "tsdb"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.storage}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if not wait_for(self._ready, timeout=30, interval=0.2):
            raise RuntimeError(f"prometheus did not become ready:\n{self.log_path.read_text()[-3000:]}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alerts(self) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts: labels, annotations, state, activeAt, value."""
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=10) as response:
            return list(json.loads(response.read())["data"]["alerts"])

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """The raw API answer (status, data or error) of an instant query."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:  # 400 with a parse error in the body
            return dict(json.loads(exc.read()))


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
            return str(response.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server is a closed loopback port: the operator starts, serves its
    metrics (initialised at start-up) and keeps retrying the API; nothing is reconciled."""
    dead = free_port()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "none", "cluster": {"server": f"https://127.0.0.1:{dead}", "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "none", "user": {"token": "unused"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
        "current-context": "none",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    if not wait_for(predicate, timeout=timeout, interval=0.5):
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
