"""Every API permission the operator needs, and why: the source of truth for RBAC.

The chart's Role/ClusterRole must grant exactly these (a test compares them), so a
new API call in the operator cannot ship without its verb, and no verb ships that the
operator does not use. Secrets are absent on purpose: pods reference them by name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    why: str


REQUIRED: tuple[Permission, ...] = (
    Permission(
        "finetune.dev",
        "finetunejobs",
        ("get", "list", "watch", "patch", "delete"),
        "watch jobs; kopf drops a finalizer left by versions with per-job timers; delete after ttlSecondsAfterFinished",
    ),
    Permission("finetune.dev", "finetunejobs/status", ("get", "patch"), "write status through the subresource"),
    Permission("apps", "statefulsets", ("get", "list", "watch", "create", "patch"), "server-side apply the workers"),
    Permission("", "services", ("get", "create", "patch"), "server-side apply the headless Service"),
    Permission("", "configmaps", ("get", "create", "patch"), "server-side apply hostfile and DeepSpeed config"),
    Permission(
        "",
        "pods",
        ("get", "list", "watch", "create", "patch", "delete"),
        "follow ranks; gang restart by name; the model inspector pod, server-side applied (the operator already "
        "creates pods of any template through its StatefulSets: this grants nothing more)",
    ),
    Permission("", "persistentvolumeclaims", ("get",), "check a multi-node job's claims are ReadWriteMany"),
    Permission("", "events", ("create", "list"), "report transitions; read why a pod waits"),
    Permission("apps", "deployments", ("get", "create", "patch"), "spec.serving target Deployment: vLLM serving"),
    Permission(
        "serving.kserve.io",
        "inferenceservices",
        ("get", "create", "patch"),
        "spec.serving target InferenceService (KServe)",
    ),
    Permission(
        "serving.kserve.io",
        "llminferenceservices",
        ("get", "create", "patch"),
        "spec.serving target LLMInferenceService (KServe)",
    ),
)

OPTIONAL: tuple[Permission, ...] = (
    Permission("monitoring.coreos.com", "podmonitors", ("get", "create", "patch"), "only with podMonitor enabled"),
)

KUEUE: tuple[Permission, ...] = (
    Permission(
        "kueue.x-k8s.io",
        "workloads",
        ("get", "list", "watch", "create", "patch", "delete"),
        "a queued job's Workload: server-side applied, watched for admission and eviction, replaced on a resize",
    ),
    Permission(
        "kueue.x-k8s.io",
        "workloads/status",
        ("patch",),
        "give back an evicted job's quota; mark a finished job's Workload Finished",
    ),
)
"""Only with `kueue.enabled`: in the operator's Role(s), next to REQUIRED."""

KUEUE_CLUSTER: tuple[Permission, ...] = (
    Permission("kueue.x-k8s.io", "resourceflavors", ("get",), "the admitted flavor's nodeLabels (cluster-scoped)"),
    Permission("kueue.x-k8s.io", "workloadpriorityclasses", ("get",), "a job's priority, by its priority-class label"),
)
"""Only with `kueue.enabled`: ResourceFlavors are cluster-scoped, so they get a ClusterRole of
their own, even when the operator watches only some namespaces."""
