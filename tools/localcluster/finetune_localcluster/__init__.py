"""A real local Kubernetes control plane for tests and the demo.

`LocalCluster` (cluster.py) starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok with simulated GPU nodes and optional process nodes (process_node.py)
that really run pods; `python -m finetune_localcluster up|down|env` does the same from a shell.
"""

from finetune_localcluster.cluster import (
    KWOK_NODE_SELECTOR,
    PROCESS_NODE_LABEL,
    PROCESS_NODE_PLACEMENT,
    ClusterError,
    LocalCluster,
)
from finetune_localcluster.kube import Kube, KubeError, wait_for

__all__ = [
    "KWOK_NODE_SELECTOR",
    "PROCESS_NODE_LABEL",
    "PROCESS_NODE_PLACEMENT",
    "ClusterError",
    "Kube",
    "KubeError",
    "LocalCluster",
    "wait_for",
]
