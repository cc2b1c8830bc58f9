"""`spec.serving`: what the API accepts and what it refuses, naming the field (pydantic; the same
rules reach the apiserver as CEL, tests/cluster/test_crd_contract.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import job_document
from tests.support.job_menu import parse_job


def problems(**spec: Any) -> list[str]:
    job, lines = parse_job(job_document(**spec))
    assert (job is None) == bool(lines)
    return lines


@pytest.mark.parametrize(
    "spec",
    [
        {"serving": {"target": "Deployment"}},
        {"serving": {"target": "InferenceService", "runtime": "kserve-huggingfaceserver"}},
        {"serving": {"target": "LLMInferenceService", "baseModelUri": "hf://HuggingFaceTB/SmolLM2-135M-Instruct"}},
        {"serving": {"target": "Deployment", "model": "merged"}, "output": {"uri": "pvc://o/j", "mergedModel": True}},
        # rank 64 does not fit vLLM's default 16: auto serves the merged model instead
        {
            "serving": {"target": "Deployment"},
            "method": {"type": "lora", "lora": {"r": 64}},
            "output": {"uri": "pvc://o/j", "mergedModel": True},
        },
        {"serving": {"target": "Deployment", "maxLoraRank": 64}, "method": {"type": "lora", "lora": {"r": 64}}},
        {"serving": {"target": "InferenceService"}, "method": {"type": "full"}},
    ],
)
def test_servable_jobs_are_accepted(spec: dict[str, Any]) -> None:
    assert problems(**spec) == []


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"serving": {"target": "Knative"}}, "spec.serving.target", "InferenceService"),
        ({"serving": {"target": "Deployment", "maxLoraRank": 24}}, "spec.serving.maxLoraRank", "vLLM's LoRA ranks"),
        ({"serving": {"target": "InferenceService", "image": "vllm/vllm-openai"}}, "spec.serving.image", "Deployment"),
        ({"serving": {"target": "Deployment", "runtime": "x"}}, "spec.serving.runtime", "InferenceService"),
        ({"serving": {"target": "Deployment", "model": "merged"}}, "spec.serving.model", "output.mergedModel"),
        (
            {"serving": {"target": "Deployment", "model": "adapter"}, "method": {"type": "full"}},
            "spec.serving.model",
            "full fine-tune serves its model",
        ),
        (
            {"serving": {"target": "Deployment"}, "method": {"type": "lora", "lora": {"r": 64}}},
            "spec.serving.maxLoraRank",
            "serve the merged model",
        ),
        (
            {"serving": {"target": "Deployment", "model": "adapter"}, "method": {"type": "lora", "lora": {"r": 32}},
             "output": {"uri": "pvc://o/j", "mergedModel": True}},
            "spec.serving.maxLoraRank",
            "raise serving.maxLoraRank",
        ),
        ({"serving": {"target": "Deployment", "baseModelUri": "builtin://tiny-llama"}}, "spec.serving.baseModelUri",
         "hf://org/name"),
        ({"serving": {"target": "Deployment", "name": "9lives"}}, "spec.serving.name", "DNS-1035"),
    ],
)  # fmt: skip
def test_what_a_runtime_cannot_serve_is_refused_naming_the_field(spec: dict[str, Any], field: str, words: str) -> None:
    lines = problems(**spec)
    assert any(line.startswith(field) and words in line for line in lines), lines
