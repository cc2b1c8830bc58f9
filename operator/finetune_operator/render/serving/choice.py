"""What a job's serving loads and from where: the artifact (adapter, merged or model), the base
model's URI as the runtime reads it, and the result's URIs. A job the target cannot serve is a
`Refused` with the field and what would work instead; the API refused what it can see in the
spec alone (`api.spec` serving rules), this sees the result and the base model's location."""

from __future__ import annotations

from dataclasses import dataclass

from ...api.job import FineTuneJob
from ...api.serving import Artifact, ServedModel, ServingSpec, ServingTarget
from ...api.status import Result
from ...api.storage_uri import Scheme, StorageUri

ADAPTER_DIR, MERGED_DIR, MODEL_DIR = "adapter", "merged", "model"
"""The folders a trainer writes under the job's output (`finetune_trainer.storage.paths`)."""


@dataclass(frozen=True)
class Choice:
    """What to serve: `model_uri` is what the runtime loads as its model (the base for an adapter,
    else the merged or full model); `adapter_uri` the adapter on it (None: no LoRA)."""

    spec: ServingSpec
    name: str
    artifact: Artifact
    model_uri: str
    adapter_uri: str | None
    adapter_name: str | None

    @property
    def served_model_name(self) -> str:
        """What an OpenAI request names: the adapter where there is one, else the model."""
        return self.adapter_name or self.name

    @property
    def model_name(self) -> str:
        """The runtime's name for the model it loads: `<name>-base` under an adapter (which is
        `<name>`), else `<name>`."""
        return f"{self.name}-base" if self.adapter_name else self.name


@dataclass(frozen=True)
class Refused:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def predicted_result(job: FineTuneJob) -> Result:
    """The result URIs a successful run of `job` will report (what `ftjob render` previews)."""
    output = job.spec.output.uri.rstrip("/")
    if StorageUri.of(output).scheme is Scheme.PATH:
        output = "file://" + StorageUri.of(output).path.rstrip("/")
    if not job.spec.method.traits.has_adapter:
        return Result(model_uri=f"{output}/{MODEL_DIR}")
    merged = f"{output}/{MERGED_DIR}" if job.spec.output.merged_model else None
    return Result(adapter_uri=f"{output}/{ADAPTER_DIR}", merged_model_uri=merged)


def _artifact(job: FineTuneJob, spec: ServingSpec) -> Artifact:
    if not job.spec.method.traits.has_adapter:
        return Artifact.MODEL
    if spec.model == ServedModel.MERGED:
        return Artifact.MERGED
    if spec.model == ServedModel.ADAPTER or job.spec.method.lora_or_default.r <= spec.max_lora_rank:
        return Artifact.ADAPTER
    return Artifact.MERGED  # auto, and the adapter's rank is above the runtime's (the API checked it is exported)


def _runtime_uri(uri: str) -> str | None:
    """`uri` as a serving runtime reads it (a hub id as hf://org/name), None where it cannot."""
    parsed = StorageUri.of(uri)
    if parsed.scheme is Scheme.HUB:
        return f"hf://{parsed.repo}"
    if parsed.scheme in (Scheme.CLAIM, Scheme.S3):
        return uri
    return None


def choose(job: FineTuneJob, result: Result | None = None) -> Choice | Refused:
    """What `job.spec.serving` serves, given its result (default: the predicted one)."""
    spec = job.spec.serving
    if spec is None:
        return Refused("spec.serving", "not set")
    result = result or predicted_result(job)
    artifact = _artifact(job, spec)
    name = spec.name or job.name
    if artifact is Artifact.ADAPTER:
        base = spec.base_model_uri or _runtime_uri(job.spec.model.uri)
        if base is None:
            return Refused(
                "spec.serving.baseModelUri",
                f"model.uri {job.spec.model.uri!r} is not a location a serving runtime reads: set baseModelUri to "
                "where the same base is (hf://org/name, pvc:// or s3://), or serve the merged model "
                "(serving.model: merged, output.mergedModel: true)",
            )
        where = result.adapter_uri
        if where is None or _runtime_uri(where) is None:
            return Refused("spec.output.uri", f"the adapter is at {where!r}, where no serving runtime reads it: "
                           "write the output to pvc:// or s3://")  # fmt: skip
        return Choice(spec, name, artifact, base, where, adapter_name=name)
    where = result.merged_model_uri if artifact is Artifact.MERGED else result.model_uri
    if where is None or _runtime_uri(where) is None:
        return Refused("spec.output.uri", f"the {artifact} model is at {where!r}, where no serving runtime reads it: "
                       "write the output to pvc:// or s3://")  # fmt: skip
    return Choice(spec, name, artifact, where, None, None)


def target_refusal(choice: Choice) -> Refused | None:
    """What the target itself cannot read: a vLLM Deployment mounts claims and downloads hub
    models, but has no storage initializer for s3:// (KServe's targets have one)."""
    if choice.spec.target != ServingTarget.DEPLOYMENT:
        return None
    for uri in (choice.model_uri, choice.adapter_uri):
        if uri is not None and StorageUri.of(uri).scheme is Scheme.S3:
            return Refused(
                "spec.serving.target",
                f"a vLLM Deployment reads pvc:// and hub models, not {uri}: use InferenceService or "
                "LLMInferenceService (KServe downloads s3://), or write the output to a claim",
            )
    return None
