"""The headless Service and the GPU StatefulSet that run a job's ranks.

One pod per node; the StatefulSet ordinal is the node rank and the headless Service
gives every pod the stable DNS name the hostfile lists. `updateStrategy: OnDelete`
because a DeepSpeed gang cannot be rolled pod by pod: the operator deletes all pods
together (a gang restart) when the config changes or a rank fails. User strings reach
the container only as argv elements or env values, never through a shell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.base import parse_quantity
from ..api.job import FineTuneJob
from ..api.pod_contract import TERMINATION_LOG
from ..api.pod_env import CUDA_ALLOCATOR_DEFAULT, PodEnv
from ..api.storage_uri import MODEL_CACHE_DIR
from . import object_storage
from .config_files import CONFIG_DIR
from .env_entries import field_entry, secret_entry, value_entry
from .identity import (
    CONFIG_HASH_ANNOTATION,
    POD_INDEX_LABEL,
    config_map_name,
    labels,
    metadata,
    rank0_host,
    selector_labels,
    service_name,
    workers_name,
)
from .options import RenderOptions
from .placement import affinity, apply_overlay, node_selector, tolerations
from .stop_grace import ranks_stop_seconds
from .tracking import tracking_env
from .volumes import (
    is_hub_model,
    local_path,
    model_cache_size,
    model_cache_template,
    volume_mounts,
    volumes,
)

DEFAULT_ENV: dict[PodEnv, str] = {
    PodEnv.PYTORCH_CUDA_ALLOC_CONF: CUDA_ALLOCATOR_DEFAULT,
    PodEnv.HOME: "/tmp",
    PodEnv.HF_HOME: "/tmp/hf",
    PodEnv.PYTHONUNBUFFERED: "1",
}
"""Defaults a user's env may override."""

NCCL_ENV: dict[PodEnv, str] = {
    PodEnv.NCCL_DEBUG: "WARN",
    PodEnv.TORCH_NCCL_ASYNC_ERROR_HANDLING: "1",
    PodEnv.TORCH_NCCL_DUMP_ON_TIMEOUT: "1",
    PodEnv.TORCH_NCCL_TRACE_BUFFER_SIZE: "2000",
}
"""GPU pods' defaults (a user's env may override): a collective past its timeout aborts the rank
(SIGABRT, which the trainer reports as a collective abort, not a memory kill), says why in the log
and dumps which collective each rank was in."""


def headless_service(job: FineTuneJob, options: RenderOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, service_name(job), "workers"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job),
            "ports": [{"name": "rendezvous", "port": options.master_port, "targetPort": options.master_port}],
        },
    }


def _env(job: FineTuneJob, options: RenderOptions, grace: int) -> list[dict[str, Any]]:
    spec = job.spec
    user = {e.name: e for e in spec.env or []}
    env: list[dict[str, Any]] = [
        value_entry(PodEnv.MASTER_ADDR, rank0_host(job)),
        value_entry(PodEnv.MASTER_PORT, str(options.master_port)),
        value_entry(PodEnv.NNODES, str(spec.resources.num_nodes)),
        field_entry(PodEnv.NODE_RANK, f"metadata.labels['{POD_INDEX_LABEL}']"),
        field_entry(PodEnv.FTJOB_POD_NAME, "metadata.name"),
        field_entry(PodEnv.FTJOB_NAMESPACE, "metadata.namespace"),
        field_entry(PodEnv.FTJOB_POD_IP, "status.podIP"),
        value_entry(PodEnv.FTJOB_CONFIG_DIR, CONFIG_DIR),
        value_entry(PodEnv.FTJOB_OUTPUT_DIR, _output_dir(job)),
        value_entry(PodEnv.FTJOB_METRICS_PORT, str(options.metrics_port)),
        value_entry(PodEnv.DS_ACCELERATOR, "cuda" if spec.resources.gpus_per_node else "cpu"),
    ]
    defaults = dict(DEFAULT_ENV)
    defaults[PodEnv.FTJOB_STOP_GRACE_SECONDS] = str(ranks_stop_seconds(grace))
    if is_hub_model(spec.model.uri):  # downloaded once per pod into the cache, before the ranks start
        defaults[PodEnv.HF_HOME] = f"{MODEL_CACHE_DIR}/hf"
        env.append(value_entry(PodEnv.FTJOB_PREFETCH_MODEL, "1"))
        defaults[PodEnv.FTJOB_DOWNLOAD_TIMEOUT_SECONDS] = str(options.download_timeout_seconds)
    if options.hub_endpoint:  # a mirror: the trainer's hub library reads it (a user's env may override)
        defaults[PodEnv.HF_ENDPOINT] = options.hub_endpoint
    if spec.resources.cpu is not None:  # torch would start one thread per host core in every rank
        # (without a cpu request the node launcher divides the CPUs the pod may use among its ranks)
        threads = str(max(1, int(parse_quantity(spec.resources.cpu)) // spec.resources.ranks_per_node))
        defaults[PodEnv.OMP_NUM_THREADS] = defaults[PodEnv.MKL_NUM_THREADS] = threads
    if spec.resources.gpus_per_node:
        defaults.update(NCCL_ENV)
    env += [value_entry(k, v) for k, v in defaults.items() if k not in user]
    env += tracking_env(job, spec.image or options.trainer_image, set(user))
    env += object_storage.env(job, options, MODEL_CACHE_DIR)
    if spec.hf_token_secret_ref and PodEnv.HF_TOKEN not in user:
        ref = spec.hf_token_secret_ref
        env.append(secret_entry(PodEnv.HF_TOKEN, ref.name, ref.key))
    for var in spec.env or []:
        if var.value_from is not None:
            ref = var.value_from.secret_key_ref
            env.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            env.append({"name": var.name, "value": var.value})
    return env


def _output_dir(job: FineTuneJob) -> str:
    if object_storage.output_on_s3(job):  # staged on the pod's scratch, uploaded from there
        return object_storage.OUTPUT_STAGING_DIR
    return local_path(job.spec.output.uri) or "/tmp/output"


def _ephemeral_storage(job: FineTuneJob, scratch_bytes: int) -> str | None:
    """The model cache's and the scratch's emptyDirs: the kubelet evicts a pod that outgrows its request."""
    cache = model_cache_size(job)
    if not scratch_bytes:
        return cache
    total = scratch_bytes + (int(parse_quantity(cache)) if cache is not None else 0)
    return f"{-(-total // 2**20)}Mi"


def _resources(job: FineTuneJob, host_bytes: int, scratch_bytes: int = 0) -> dict[str, Any]:
    """GPUs; cpu and memory as the spec sets them (request = limit).

    Without `resources.memory`, the pod requests the host memory the plan needs (its ranks'
    baseline plus what ZeRO offloads to the CPU), with no limit: the scheduler then puts it
    only on a node that has that much free, instead of letting an offloading job start on a
    full node and be killed there.
    """
    res = job.spec.resources
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if res.gpus_per_node:
        limits["nvidia.com/gpu"] = res.gpus_per_node
    for key, value in (("cpu", res.cpu), ("memory", res.memory)):
        if value is not None:
            limits[key] = requests[key] = str(value)
    if res.memory is None and host_bytes > 0:
        requests["memory"] = f"{-(-host_bytes // 2**20)}Mi"
    storage = _ephemeral_storage(job, scratch_bytes)
    if storage is not None:
        limits["ephemeral-storage"] = requests["ephemeral-storage"] = storage
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _ports(job: FineTuneJob, options: RenderOptions) -> list[dict[str, Any]]:
    ports = [{"name": "rendezvous", "containerPort": options.master_port, "protocol": "TCP"}]
    for local_rank in range(job.spec.resources.ranks_per_node):
        ports.append({"name": f"metrics-{local_rank}", "containerPort": options.metrics_port + local_rank})
    return ports


def statefulset(
    job: FineTuneJob,
    options: RenderOptions,
    replicas: int,
    config_hash: str,
    host_bytes: int = 0,
    *,
    scratch_bytes: int = 0,
    model_bytes: int | None = None,
    grace_seconds: int | None = None,
    placement: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The workers; `replicas` is numNodes while running, 0 when suspended or finished.

    `host_bytes` is the plan's host memory per node (`status.plan.hostBytesPerNode`);
    `scratch_bytes` the local staging of an s3:// output (`plan.scratch.scratch_bytes`); `model_bytes`
    the model's files (`status.plan.modelBytes`), which size each pod's cache claim; `grace_seconds`
    the pods' terminationGracePeriodSeconds (`stop_grace`; None: the operator's floor); `placement`
    the nodeLabels of the ResourceFlavors Kueue admitted the job on, which join the pods' nodeSelector.
    """
    spec = job.spec
    grace = options.termination_grace_seconds if grace_seconds is None else grace_seconds
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container: dict[str, Any] = {
        "name": "trainer",
        "image": spec.image or options.trainer_image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["ftjob"],
        "args": ["train", "--config", CONFIG_DIR],
        "env": _env(job, options, grace),
        "ports": _ports(job, options),
        "resources": _resources(job, host_bytes, scratch_bytes),
        "volumeMounts": volume_mounts(job, CONFIG_DIR) + object_storage.volume_mounts(job, options),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted,
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "subdomain": service_name(job),
        "terminationGracePeriodSeconds": grace,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": options.run_as_user,
            "runAsGroup": options.run_as_user,
            "fsGroup": options.run_as_user,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes(job, config_map_name(job)) + object_storage.volumes(job, options, scratch_bytes),
    }
    if account := object_storage.service_account(job):  # workload identity: its webhook projects the token
        pod_spec["serviceAccountName"] = account
    if selector := node_selector(job):
        pod_spec["nodeSelector"] = selector
    if gpu_affinity := affinity(job, options.gpu_placement):
        pod_spec["affinity"] = gpu_affinity
    if tolerated := tolerations(job):
        pod_spec["tolerations"] = tolerated
    if spec.resources.priority_class_name:
        pod_spec["priorityClassName"] = spec.resources.priority_class_name
    pod_metadata: dict[str, Any] = {
        "labels": labels(job, "trainer"),
        "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
    }
    apply_overlay(job, pod_metadata, pod_spec)
    if placement:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **placement}
    workers: dict[str, Any] = {
        "serviceName": service_name(job),
        "replicas": replicas,
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "OnDelete"},
        "selector": {"matchLabels": selector_labels(job)},
        "template": {"metadata": pod_metadata, "spec": pod_spec},
    }
    cache = model_cache_template(job, model_bytes, options.model_cache_storage_class)
    if cache is not None:
        # Kept while the gang restarts or scales to 0 (suspended, preempted, finished); deleted with the job.
        workers["volumeClaimTemplates"] = [cache]
        workers["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Delete", "whenScaled": "Retain"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(job, workers_name(job), "workers"),
        "spec": workers,
    }
