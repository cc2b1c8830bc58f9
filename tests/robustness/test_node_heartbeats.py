"""A starved kwok must not cost a pod its Ready condition.

On two cores at a load of 10, kwok's node heartbeat once came over 40 s late (Kubernetes'
default node-monitor grace period). The controller-manager then marked the node lost and set
its pods Ready=False, which kwok never sets back, and the operator-chaos test waited forever for
a gang's pod. Here kwok is stopped (SIGSTOP) for longer than that default while a pod runs on
its node: the node must stay Ready and the pod with it, and once kwok runs again it must still
start new pods.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.cluster import KWOK_NODE_SELECTOR

DEFAULT_GRACE_S = 40.0  # kube-controller-manager's --node-monitor-grace-period default
STALL_S = DEFAULT_GRACE_S + 20.0  # the monitor checks every 5 s; kwok's last beat precedes the stop
NAMESPACE = "heartbeats"


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {**KWOK_NODE_SELECTOR, "kubernetes.io/hostname": "kwok-gpu-0"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/none:1"}],
        },
    }


def _ready(kube: Kube, name: str) -> bool:
    pod = kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _node_ready(kube: Kube) -> str:
    node = kube.get("/api/v1/nodes/kwok-gpu-0")
    return str(next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"))


@pytest.fixture
def namespace(robust_kube: Kube) -> Iterator[str]:
    robust_kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    yield NAMESPACE
    robust_kube.delete(f"/api/v1/namespaces/{NAMESPACE}")


@pytest.mark.timeout(STALL_S + 120)
def test_a_kwok_stalled_past_the_default_node_grace_keeps_its_pods_ready(
    robust_cluster: LocalCluster, robust_kube: Kube, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    robust_kube.create(pods, _pod("before"))
    wait_for(lambda: _ready(robust_kube, "before") or None, 60, "pod 'before' Ready")
    kwok = next(p["pid"] for p in robust_cluster.procs if p["name"] == "kwok")
    seen: list[tuple[int, str, bool]] = []
    os.kill(kwok, signal.SIGSTOP)
    try:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < STALL_S:
            seen.append((round(elapsed), _node_ready(robust_kube), _ready(robust_kube, "before")))
            time.sleep(5.0)
    finally:
        os.kill(kwok, signal.SIGCONT)
    assert all(node == "True" and pod for _, node, pod in seen), f"(seconds, node Ready, pod Ready): {seen}"
    robust_kube.create(pods, _pod("after"))
    wait_for(lambda: _ready(robust_kube, "after") or None, 60, "pod 'after' Ready once kwok runs again")
    assert _ready(robust_kube, "before")
