"""KServe's serving objects (v0.16 schemas, checked against its CRDs in tests/cluster):

- `InferenceService` (serving.kserve.io/v1beta1) on the Hugging Face runtime, whose vLLM backend
  takes vLLM's own arguments: the base model and the adapter each get a `storageUris` entry (the
  storage initializer downloads `hf://`, `s3://` and mounts `pvc://`) under one parent, /mnt/models,
  as KServe's validation requires; `--lora-modules name=path` names the adapter. Its OpenAI API is
  under `/openai/v1` of the predictor.
- `LLMInferenceService` (serving.kserve.io/v1alpha1): `model.uri` and `model.lora.adapters`.
"""

from __future__ import annotations

from typing import Any

from .choice import Choice
from .vllm import lora_args

MODELS_DIR = "/mnt/models"
GPU_RESOURCE = "nvidia.com/gpu"


def _resources(choice: Choice) -> dict[str, Any]:
    gpus = choice.spec.gpus
    return {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}} if gpus else {}


def inference_service(choice: Choice, meta: dict[str, Any]) -> dict[str, Any]:
    args = [f"--model_name={choice.model_name}", *choice.spec.args]
    model: dict[str, Any] = {"modelFormat": {"name": "huggingface"}}
    predictor: dict[str, Any] = {"model": model}
    if choice.adapter_uri is None:
        model["storageUri"] = choice.model_uri
    else:
        base, adapter = f"{MODELS_DIR}/base", f"{MODELS_DIR}/adapters/{choice.adapter_name}"
        predictor["storageUris"] = [
            {"uri": choice.model_uri, "mountPath": base},
            {"uri": choice.adapter_uri, "mountPath": adapter},
        ]
        lora = lora_args({str(choice.adapter_name): adapter}, choice.spec.max_lora_rank)
        args = [f"--model_name={choice.model_name}", f"--model_dir={base}", *lora, *choice.spec.args]
    model["args"] = args
    if choice.spec.runtime:
        model["runtime"] = choice.spec.runtime
    if resources := _resources(choice):
        model["resources"] = resources
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": predictor},
    }


def inference_service_url(choice: Choice, namespace: str) -> str:
    return f"http://{choice.name}-predictor.{namespace}.svc.cluster.local/openai/v1"


def llm_inference_service(choice: Choice, meta: dict[str, Any]) -> dict[str, Any]:
    model: dict[str, Any] = {"uri": choice.model_uri, "name": choice.model_name}
    if choice.adapter_uri is not None:
        model["lora"] = {"adapters": [{"uri": choice.adapter_uri, "name": choice.adapter_name}]}
    spec: dict[str, Any] = {"model": model, "replicas": 1}
    container: dict[str, Any] = {"name": "main"}
    if resources := _resources(choice):
        container["resources"] = resources
    if choice.spec.args or choice.adapter_uri is not None:
        lora = [f"--max-lora-rank={choice.spec.max_lora_rank}"] if choice.adapter_uri is not None else []
        container["args"] = [*lora, *choice.spec.args]
    spec["template"] = {"containers": [container]}
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceService", "metadata": meta, "spec": spec}
