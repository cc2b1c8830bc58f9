"""Every serving object the operator renders passes server-side validation against KServe's own
CRDs (v0.16.0, from its Go module) and the apiserver's built-in Deployment and Service schemas.

Each target is rendered for a LoRA job (base plus adapter), a job whose rank makes `auto` serve
the merged model, and a full fine-tune, then created with `dryRun=All` and strict field
validation, so an unknown or misplaced field is an error, not silently dropped."""

from __future__ import annotations

from typing import Any

import pytest

from finetune_localcluster import Kube, KubeError
from finetune_localcluster.kserve import install
from finetune_operator.api import FineTuneJob
from finetune_operator.render.serving.choice import Refused
from finetune_operator.render.serving.objects import render_serving
from tests.factories import job_document

pytestmark = [pytest.mark.slow]

PATHS = {
    "InferenceService": "/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices",
    "LLMInferenceService": "/apis/serving.kserve.io/v1alpha1/namespaces/{ns}/llminferenceservices",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
}
JOBS: dict[str, dict[str, Any]] = {
    "lora-adapter": {"model": {"uri": "hf://meta-llama/Llama-3.1-8B"}, "output": {"uri": "pvc://out/llama"}},
    "lora-merged": {
        "model": {"uri": "meta-llama/Llama-3.1-8B"},
        "method": {"type": "lora", "lora": {"r": 64, "alpha": 128}},
        "output": {"uri": "pvc://out/llama", "mergedModel": True},
    },
    "full": {"model": {"uri": "meta-llama/Llama-3.1-8B"}, "method": {"type": "full"}, "output": {"uri": "pvc://o/f"}},
    "s3-adapter": {
        "model": {"uri": "s3://models/llama"},
        "output": {"uri": "s3://runs/llama"},
        "objectStorage": {"credentials": {"secretName": "s3"}},
    },
}


@pytest.fixture(scope="module")
def kserve(kube: Kube) -> list[str]:
    return install(kube)


@pytest.mark.parametrize("target", ["InferenceService", "LLMInferenceService", "Deployment"])
@pytest.mark.parametrize("kind", sorted(JOBS))
def test_rendered_serving_objects_pass_server_side_validation(
    kserve: list[str], kube: Kube, namespace: str, target: str, kind: str
) -> None:
    doc = job_document(**JOBS[kind], serving={"target": target, "args": ["--max-model-len=4096"]})
    doc["metadata"].update({"namespace": namespace, "uid": "0f0e0d0c-0000-4000-8000-000000000001"})
    served = render_serving(FineTuneJob.from_manifest(doc))
    if kind == "s3-adapter" and target == "Deployment":  # no storage initializer: refused, naming the field
        assert isinstance(served, Refused) and served.field == "spec.serving.target", served
        return
    assert not isinstance(served, Refused), served
    assert [o["kind"] for o in served.objects] == (["Deployment", "Service"] if target == "Deployment" else [target])
    for obj in served.objects:
        assert "ownerReferences" not in obj["metadata"], "served objects outlive the job"
        assert "finetune.dev/job-name" not in obj["metadata"]["labels"], "the operator's watches select on it"
        try:
            created = kube.request(
                "POST",
                PATHS[obj["kind"]].format(ns=namespace),
                obj,
                params={"dryRun": "All", "fieldValidation": "Strict"},
            )
        except KubeError as exc:
            pytest.fail(f"{obj['kind']} of a {kind} job refused: {exc}")
        assert created["metadata"]["name"] == obj["metadata"]["name"]
        assert kept(obj["spec"], created["spec"]), (obj["spec"], created["spec"])


def kept(sent: Any, stored: Any) -> bool:
    """Whether every field sent is in what the apiserver stored, unchanged (it may add defaults; a
    field its schema prunes would be missing)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(key in stored and kept(v, stored[key]) for key, v in sent.items())
    if isinstance(sent, list):
        return isinstance(stored, list) and len(sent) == len(stored) and all(map(kept, sent, stored))
    return bool(sent == stored)


def test_a_field_kserve_does_not_know_is_refused(kserve: list[str], kube: Kube, namespace: str) -> None:
    """The check above can fail: strict validation against KServe's schema refuses a misplaced field."""
    doc = job_document(serving={"target": "InferenceService"}, model={"uri": "hf://org/base"})
    doc["metadata"]["namespace"] = namespace
    served = render_serving(FineTuneJob.from_manifest(doc))
    assert not isinstance(served, Refused)
    wrong = served.objects[0]
    wrong["spec"]["predictor"]["model"]["loraAdapters"] = ["x"]
    with pytest.raises(KubeError, match="unknown field"):
        kube.request("POST", PATHS["InferenceService"].format(ns=namespace), wrong,
                     params={"dryRun": "All", "fieldValidation": "Strict"})  # fmt: skip
