"""`spec.serving` and `status.serving`: what serves a job's result once it succeeded.

The operator renders the serving object (`render.serving`) and applies it after success; it is
not owned by the job, so it outlives it, and is labelled with the job. Three targets, all of
them vLLM underneath: KServe's `InferenceService` (its Hugging Face runtime, vLLM backend),
KServe's `LLMInferenceService` (`model.lora.adapters`), or a plain vLLM `Deployment` and
`Service` for clusters without KServe. What a target cannot serve is refused here, naming the
field and offering the merged model where an adapter does not fit.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import Field

from .base import DNS_SUBDOMAIN_PATTERN, VISIBLE, ApiModel
from .object_storage import S3_URI
from .rules import CrossFieldRule, RuledModel


class ServingTarget(StrEnum):
    # KServe's InferenceService, its Hugging Face runtime (vLLM backend)
    INFERENCE_SERVICE = "InferenceService"
    # KServe's LLMInferenceService, the adapters in model.lora.adapters
    LLM_INFERENCE_SERVICE = "LLMInferenceService"
    # a vLLM Deployment and its Service, for clusters without KServe
    DEPLOYMENT = "Deployment"


class ServedModel(StrEnum):
    # the adapter on its base where it fits the runtime, else the merged model
    AUTO = "auto"
    ADAPTER = "adapter"
    MERGED = "merged"


class Artifact(StrEnum):
    # what a serving object loads, resolved from serving.model and the job's method:
    # the base model plus the trained LoRA adapter (status.result.adapterUri)
    ADAPTER = "adapter"
    # base and adapter merged (status.result.mergedModelUri)
    MERGED = "merged"
    # a full fine-tune's model (status.result.modelUri)
    MODEL = "model"


VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for `--max-lora-rank` (its LoRA config's `max_lora_rank`)."""
DEFAULT_MAX_LORA_RANK = 16
"""vLLM's default `--max-lora-rank`."""
SERVING_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1035 label: KServe's names for an InferenceService, and a Service's."""
BASE_MODEL_URI_PATTERN = (
    rf"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/{VISIBLE}*)?|{S3_URI})$"
)
"""Where a serving runtime loads a base model from: a hub id (`hf://org/name`), a claim or object storage."""
SERVING_PATTERN_HINTS = {
    BASE_MODEL_URI_PATTERN: "must be hf://org/name, pvc://claim/path or s3://bucket/prefix: a location a "
    "serving runtime downloads from",
    SERVING_NAME_PATTERN: "must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter",
}


class ServingSpec(RuledModel):
    """What serves the trained result once the job succeeds (the operator applies it; it is not
    deleted with the job)."""

    target: ServingTarget = Field(
        description="InferenceService (KServe, Hugging Face runtime on vLLM), LLMInferenceService (KServe) or "
        "Deployment (a vLLM Deployment and Service, no KServe needed)."
    )
    name: Annotated[str, Field(max_length=45, pattern=SERVING_NAME_PATTERN)] | None = Field(
        default=None, description="Name of the served object (default: the job's name)."
    )
    model: ServedModel = Field(
        default=ServedModel.AUTO,
        description="What is served: adapter (the base plus the trained LoRA adapter), merged (needs "
        "output.mergedModel), or auto: the adapter where it fits the runtime (rank at most maxLoraRank), else "
        "the merged model. A full fine-tune serves its model (auto only).",
    )
    base_model_uri: Annotated[str, Field(max_length=512, pattern=BASE_MODEL_URI_PATTERN)] | None = Field(
        default=None,
        description="Where the runtime loads the base model from (an adapter is served on it), when model.uri is "
        "not a location it reads: a builtin:// model or a path in the trainer image. Default: model.uri "
        "(a hub id as hf://org/name).",
    )
    max_lora_rank: int = Field(
        default=DEFAULT_MAX_LORA_RANK,
        description="The runtime's largest LoRA rank (vLLM's --max-lora-rank: "
        + ", ".join(str(r) for r in VLLM_MAX_LORA_RANKS)
        + "); an adapter of a higher rank is not served as an adapter.",
    )
    runtime: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None,
        description="InferenceService only: the ServingRuntime to use (default: KServe picks one for huggingface).",
    )
    image: Annotated[str, Field(max_length=512, pattern=f"^{VISIBLE}+$")] | None = Field(
        default=None, description="Deployment only: the vLLM image (default: the operator's pinned vllm-openai image)."
    )
    gpus: Annotated[int, Field(ge=0, le=16)] = Field(default=1, description="GPUs of each serving replica.")
    args: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=32)] = Field(
        default_factory=list, description="More vLLM arguments (e.g. --max-model-len=4096)."
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="!has(self.maxLoraRank) || self.maxLoraRank in ["
            + ", ".join(str(r) for r in VLLM_MAX_LORA_RANKS)
            + "]",
            message="must be one of vLLM's LoRA ranks: " + ", ".join(str(r) for r in VLLM_MAX_LORA_RANKS),
            field_path=".maxLoraRank",
            check=lambda s: s.max_lora_rank in VLLM_MAX_LORA_RANKS,
        ),
        CrossFieldRule(
            cel="!has(self.image) || self.target == 'Deployment'",
            message="image is for target Deployment; KServe's targets take their runtime's image",
            field_path=".image",
            check=lambda s: s.image is None or s.target == ServingTarget.DEPLOYMENT,
        ),
        CrossFieldRule(
            cel="!has(self.runtime) || self.target == 'InferenceService'",
            message="runtime (a KServe ServingRuntime) is for target InferenceService",
            field_path=".runtime",
            check=lambda s: s.runtime is None or s.target == ServingTarget.INFERENCE_SERVICE,
        ),
    )


class ServedObject(ApiModel):
    kind: Annotated[str, Field(max_length=64)]
    name: Annotated[str, Field(max_length=253)]


class ServingStatus(ApiModel):
    """What the operator applied to serve the result, and where to query it."""

    objects: Annotated[list[ServedObject], Field(max_length=4)] = Field(
        default_factory=list, description="The served objects (not deleted with the job; labelled with it)."
    )
    served: Artifact | None = Field(default=None, description="What they load: adapter, merged or model.")
    model_name: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="The model name to ask for in OpenAI API requests."
    )
    url: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="The in-cluster OpenAI API base URL (KServe's own status.url may add a route)."
    )
    spec_hash: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="Identity of what was applied: a changed serving spec is applied again."
    )
