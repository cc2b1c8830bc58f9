"""The serving objects as pure renders: what is served, from where, under which names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finetune_operator.api import FineTuneJob
from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.serving import Artifact
from finetune_operator.api.status import Result
from finetune_operator.render.serving.choice import Refused, predicted_result
from finetune_operator.render.serving.objects import SERVED_JOB_LABEL, render_serving
from finetune_trainer.storage import paths
from tests.factories import job_document


def job(**spec: Any) -> FineTuneJob:
    return FineTuneJob.from_manifest(job_document(**spec))


def test_the_predicted_result_is_what_the_trainer_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ftjob render` previews serving from the URIs a run will report: the trainer's own names for them."""
    monkeypatch.setenv(PodEnv.FTJOB_PVC_ROOT, str(tmp_path))
    j = job(output={"uri": "pvc://runs/llama/", "mergedModel": True})
    out = tmp_path / "runs" / "llama"
    predicted = predicted_result(j)
    assert predicted.adapter_uri == paths.result_uri(j.spec.output.uri, out, out / "adapter")
    assert predicted.merged_model_uri == paths.result_uri(j.spec.output.uri, out, out / "merged")


@pytest.mark.parametrize("target", ["InferenceService", "LLMInferenceService", "Deployment"])
def test_an_adapter_is_served_on_its_base_under_the_serving_name(target: str) -> None:
    served = render_serving(job(model={"uri": "org/base"}, serving={"target": target, "name": "chat"}))
    assert not isinstance(served, Refused), served
    assert (served.status.served, served.status.model_name) == (Artifact.ADAPTER, "chat")
    text = str(served.objects)
    assert "pvc://out/job/adapter" in text or "/mnt/pvc/out/job/adapter" in text
    assert "chat-base" in text  # the base's own name differs from the adapter's: one name, one model
    for obj in served.objects:
        assert obj["metadata"]["labels"][SERVED_JOB_LABEL] == "job"
        assert "ownerReferences" not in obj["metadata"]


def test_auto_serves_the_merged_model_when_the_rank_is_above_the_runtimes() -> None:
    j = job(method={"type": "lora", "lora": {"r": 64}}, output={"uri": "s3://bkt/run", "mergedModel": True},
            objectStorage={"credentials": {"secretName": "s"}}, serving={"target": "InferenceService"})  # fmt: skip
    served = render_serving(j, Result(adapter_uri="s3://bkt/run/adapter", merged_model_uri="s3://bkt/run/merged"))
    assert not isinstance(served, Refused), served
    assert served.status.served == Artifact.MERGED
    model = served.objects[0]["spec"]["predictor"]["model"]
    assert model["storageUri"] == "s3://bkt/run/merged" and "--enable-lora" not in model["args"]


def test_a_builtin_base_needs_a_location_a_runtime_reads() -> None:
    j = job(model={"uri": "builtin://smollm2-135m-instruct"}, serving={"target": "Deployment"})
    refused = render_serving(j)
    assert isinstance(refused, Refused) and refused.field == "spec.serving.baseModelUri"
    assert "serve the merged model" in refused.message
    hub = "hf://HuggingFaceTB/SmolLM2-135M-Instruct"
    named = job(model={"uri": "builtin://smollm2-135m-instruct"}, serving={"target": "Deployment", "baseModelUri": hub})
    served = render_serving(named)
    assert not isinstance(served, Refused)
    assert (
        served.objects[0]["spec"]["template"]["spec"]["containers"][0]["args"][0]
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_a_result_inside_a_pod_is_not_served() -> None:
    refused = render_serving(job(output={"uri": "/out/job"}, serving={"target": "Deployment"}))
    assert isinstance(refused, Refused) and refused.field == "spec.output.uri", refused


def test_a_full_fine_tune_serves_its_model() -> None:
    served = render_serving(job(method={"type": "full"}, serving={"target": "LLMInferenceService"}))
    assert not isinstance(served, Refused), served
    assert served.status.served == Artifact.MODEL
    assert served.objects[0]["spec"]["model"] == {"uri": "pvc://out/job/model", "name": "job"}
