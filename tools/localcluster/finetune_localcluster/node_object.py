"""The Node object of a process node: registration with fake GPUs, conditions and heartbeats."""

from __future__ import annotations

import datetime as dt
import os

from finetune_localcluster.cluster import PROCESS_NODE_LABEL, PROCESS_NODE_TAINT
from finetune_localcluster.kube import Kube, KubeError, Obj
from finetune_localcluster.pod_runs import now


def node_conditions() -> list[Obj]:
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


def register(
    kube: Kube, name: str, *, pod_cidr: str, gpus: int, gpu_product: str, taint: bool, kubelet_port: int
) -> None:
    """Create (or re-label) the Node with fake GPUs, then send its first heartbeat."""
    res = {
        "cpu": str(os.cpu_count() or 1),
        "memory": "64Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
        "nvidia.com/gpu": str(gpus),
    }
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                PROCESS_NODE_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": gpu_product,
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [PROCESS_NODE_TAINT] if taint else [],
        },
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": node_conditions(),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
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
        kube.create("/api/v1/nodes", node)
    except KubeError as exc:
        if exc.status != 409:
            raise
        kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": node["metadata"]})
    heartbeat(kube, name, kubelet_port)


def heartbeat(kube: Kube, name: str, kubelet_port: int) -> None:
    """Node conditions and the node lease, renewed: what keeps a Node Ready."""
    kube.merge_patch(
        f"/api/v1/nodes/{name}/status",
        {
            "status": {
                "conditions": node_conditions(),
                "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            }
        },
    )
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    spec = {
        "holderIdentity": name,
        "leaseDurationSeconds": 40,
        "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    try:
        kube.merge_patch(path, {"spec": spec})
    except KubeError as exc:
        if exc.status != 404:
            raise
        kube.create(path.rsplit("/", 1)[0], {"metadata": {"name": name}, "spec": spec})
