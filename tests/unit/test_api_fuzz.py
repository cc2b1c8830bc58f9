"""Property tests: the models and the generated schema agree, and nothing crashes.

Documents are built from menus of valid, boundary and wrong values for every field,
so one corpus holds both accepted and rejected jobs. For each document:
- validation yields a job or clean `path: message` lines, never a traceback;
- pydantic accepts it exactly when the apiserver emulation (structural schema + CEL)
  does;
- an accepted job survives dump → schema validation → parse unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from finetune_operator.api import FineTuneJob, describe
from tests.crd_schema import ApiserverEmulation
from tests.factories import BASE_JOB

ABSENT = object()

MENU: dict[str, list[Any]] = {
    "model.uri": ["meta-llama/Llama-3.1-8B", "hf://Qwen/Qwen2.5-7B", "/models/x", "builtin://tiny-llama", "x y", 3],
    "model.revision": [ABSENT, None, "main", "v1.0", "-bad"],
    "model.trustRemoteCode": [ABSENT, True, False, "yes"],
    "dataset.format": [ABSENT, "alpaca", "sharegpt", "messages", "text", "csv"],
    "dataset.validationSplit": [ABSENT, 0, 0.1, 0.5, 0.51, -0.1],
    "dataset.maxSeqLength": [ABSENT, 16, 15, 4096, 131072, 131073, "long"],
    "dataset.packing": [ABSENT, True, False],
    "dataset.onMalformedLine": [ABSENT, "Fail", "Skip", "skip"],
    "method.type": [ABSENT, "lora", "qlora", "full", "dora"],
    "method.lora": [ABSENT, None, {}, {"r": 8, "alpha": 16}, {"r": 0}, {"r": 1025}, {"dropout": 1.0}],
    "method.qlora": [ABSENT, {}, {"quantType": "fp4", "doubleQuant": False}, {"computeDtype": "float32"}],
    "training.epochs": [ABSENT, None, 1, 0.5, 0, 1001],
    "training.maxSteps": [ABSENT, None, 1, 100, 0],
    "training.microBatchSize": [ABSENT, "auto", 1, 2, 3, 4, 0, 4097, "two"],
    "training.globalBatchSize": [ABSENT, 1, 8, 12, 32, 0],
    "training.learningRate": [ABSENT, 1e-4, 1, 0, 1.5],
    "training.gradientCheckpointing": [ABSENT, "auto", True, False, "true", "maybe", 1],
    "training.precision": [ABSENT, "bf16", "fp16", "fp32", "fp8"],
    "training.warmupRatio": [ABSENT, 0, 0.5, 0.6],
    "training.checkpointsToKeep": [ABSENT, 1, 100, 0, 101],
    "resources.numNodes": [ABSENT, 1, 4, 512, 0, 513],
    "resources.gpusPerNode": [ABSENT, 0, 1, 8, 16, 17],
    "resources.gpuMemory": [ABSENT, "80Gi", "24Gi", 85899345920, "1Gi", "lots", True],
    "resources.cpu": [ABSENT, None, "8", 8, "500m", "eight"],
    "resources.nodeSelector": [ABSENT, {"a": "b"}, {}],
    "resources.priorityClassName": [ABSENT, "high", "High"],
    "deepspeed.zeroStage": [ABSENT, "auto", 0, 1, 2, 3, 4, "3"],
    "deepspeed.offloadOptimizer": [ABSENT, "auto", "none", "cpu", "nvme", "gpu"],
    "deepspeed.offloadParams": [ABSENT, "auto", "none", "cpu", "nvme"],
    "deepspeed.nvmePath": [ABSENT, None, "/nvme", "nvme"],
    "deepspeed.overrides": [ABSENT, {"zero_optimization.overlap_comm": True}, {"train_batch_size": 4}, {"Bad-Key": 1}],
    "output.mergedModel": [ABSENT, True, False],
    "env": [
        ABSENT,
        [],
        [{"name": "A", "value": "1"}],
        [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
        [{"name": "RANK", "value": "0"}],
        [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        [{"name": "T"}],
    ],
    "suspend": [ABSENT, True, False],
    "failurePolicy": [ABSENT, {"backoffLimit": 0}, {"backoffLimit": 101}, {"onOutOfMemory": "Fail"}],
    "activeDeadlineSeconds": [ABSENT, None, 1, 0, 3600],
    "ttlSecondsAfterFinished": [ABSENT, 0, -1, 60],
    "surprise": [ABSENT, ABSENT, ABSENT, 1],
}

EMULATION = ApiserverEmulation()

OPERATOR_CHECKED = ("spec.training.gradientCheckpointing:", "spec.deepspeed.overrides:")
"""Fields the structural schema cannot check (boolean-or-auto; free-form DeepSpeed keys): the
apiserver stores them and the operator answers a bad value with Failed/InvalidSpec."""


def _set(spec: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = spec
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(BASE_JOB)
    for dotted, values in MENU.items():
        value = draw(st.sampled_from(values))
        if value is not ABSENT:
            _set(doc["spec"], dotted, copy.deepcopy(value))
    return doc


def _pydantic(document: dict[str, Any]) -> tuple[FineTuneJob | None, list[str]]:
    try:
        return FineTuneJob.from_manifest(document), []
    except ValidationError as exc:
        return None, describe(exc, FineTuneJob)


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(documents())
def test_models_and_schema_agree(document: dict[str, Any]) -> None:
    job, lines = _pydantic(document)
    schema_problems = EMULATION.problems(document)
    if job is None and not schema_problems and all(line.startswith(OPERATOR_CHECKED) for line in lines):
        return
    assert (job is not None) == (schema_problems == []), (
        f"pydantic: {lines or 'accepted'}; schema: {schema_problems or 'accepted'}"
    )


@FUZZ
@given(documents())
def test_errors_are_lines_naming_a_field(document: dict[str, Any]) -> None:
    job, lines = _pydantic(document)
    if job is None:
        assert lines
        for line in lines:
            path, _, message = line.partition(": ")
            assert path and message, line
            assert path.split(".")[0].split("[")[0] in {"spec", "metadata", "apiVersion", "kind"}, line
            assert "Traceback" not in line and "\n" not in line


@FUZZ
@given(documents())
def test_valid_documents_round_trip(document: dict[str, Any]) -> None:
    job, _ = _pydantic(document)
    if job is None:
        return
    wire = job.to_wire()
    assert EMULATION.problems(wire) == []
    assert FineTuneJob.from_manifest(wire) == job
