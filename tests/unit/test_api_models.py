"""The FineTuneJob models: defaults, accepted shapes, and one clear line per problem."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from finetune_operator.api import FineTuneJob, describe
from finetune_operator.api.base import parse_quantity, quantity_bytes
from finetune_operator.api.spec import RESERVED_ENV
from tests.factories import DELETE, job_document, make_job


def problems(**spec: Any) -> list[str]:
    try:
        FineTuneJob.from_manifest(job_document(**spec))
    except ValidationError as exc:
        return describe(exc, FineTuneJob)
    return []


def test_defaults_are_filled_in() -> None:
    job = make_job()
    spec = job.spec
    assert spec.method.type == "lora"
    assert spec.deepspeed.zero_stage == "auto"
    assert spec.training.micro_batch_size == "auto"
    assert spec.training.max_grad_norm == 1.0
    assert spec.model.trust_remote_code is False
    assert spec.failure_policy.backoff_limit == 3
    assert spec.failure_policy.on_out_of_memory == "Replan"
    assert spec.resources.gpu_memory_bytes == 80 * 2**30
    assert job.namespace == "ns"


def test_models_are_frozen() -> None:
    job = make_job()
    with pytest.raises(ValidationError):
        job.spec.training.seed = 3  # type: ignore[misc]


def test_wire_round_trip_is_exact() -> None:
    job = make_job(training={"maxSteps": 10, "gradientCheckpointing": True}, deepspeed={"zeroStage": 3})
    again = FineTuneJob.from_manifest(job.to_wire())
    assert again == job
    assert job.to_wire()["spec"]["training"]["gradientCheckpointing"] == "true"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"method": {"lora": {"r": 0}}}, "spec.method.lora.r: must be >= 1"),
        ({"method": {"type": "dora"}}, "spec.method.type: must be one of"),
        ({"training": {"precision": "fp8"}}, "spec.training.precision: must be one of"),
        ({"training": {"microBatchSize": "big"}}, "spec.training.microBatchSize:"),
        ({"training": {"microBatchSize": 0}}, "spec.training.microBatchSize: must be auto or an integer"),
        ({"training": {"epochs": 1, "maxSteps": 5}}, "spec.training.maxSteps: set epochs or maxSteps, not both"),
        (
            {"training": {"warmupRatio": 0.1, "warmupSteps": 5}},
            "spec.training.warmupSteps: set warmupRatio or warmupSteps, not both",
        ),
        ({"training": {"warmupSteps": -1}}, "spec.training.warmupSteps: must be >= 0"),
        (
            {"dataset": {"validationSplit": 0.1, "validationUri": "pvc://data/val.jsonl"}},
            "spec.dataset.validationUri: set validationSplit or validationUri, not both",
        ),
        ({"dataset": {"validationUri": "not a uri"}}, "spec.dataset.validationUri: invalid value 'not a uri'"),
        (  # a built-in model is no dataset: the field takes the dataset locations, as dataset.uri does
            {"dataset": {"validationUri": "builtin://tiny-llama"}},
            "spec.dataset.validationUri: invalid value 'builtin://tiny-llama': must be a hub id (org/name or "
            "hf://org/name), pvc://claim/path, s3://bucket/prefix",
        ),
        (
            {"training": {"globalBatchSize": 10, "microBatchSize": 4}},
            "spec.training.globalBatchSize: must be a multiple",
        ),
        ({"training": {"learningRate": 0}}, "spec.training.learningRate: must be > 0"),
        ({"resources": {"numNodes": 0}}, "spec.resources.numNodes: must be >= 1"),
        ({"resources": {"gpuMemory": "lots"}}, "spec.resources.gpuMemory: not a Kubernetes quantity"),
        ({"resources": {"gpuMemory": "512Mi"}}, "spec.resources.gpuMemory: must be at least 1Gi"),
        ({"deepspeed": {"zeroStage": 5}}, "spec.deepspeed.zeroStage: must be one of"),
        ({"deepspeed": {"zeroStage": 2, "offloadParams": "cpu"}}, "spec.deepspeed.offloadParams: parameter offload"),
        ({"deepspeed": {"offloadOptimizer": "nvme"}}, "spec.deepspeed.nvmePath: nvme offload needs nvmePath"),
        ({"deepspeed": {"zeroStage": 0, "offloadOptimizer": "cpu"}}, "spec.deepspeed.offloadOptimizer: optimizer"),
        (
            {"deepspeed": {"overrides": {"train_batch_size": 8}}},
            "spec.deepspeed.overrides: key 'train_batch_size' is set",
        ),
        ({"deepspeed": {"overrides": {"zero_optimization.stage": 1}}}, "is set by the plan"),
        ({"deepspeed": {"overrides": {"zero_optimization": "off"}}}, "key 'zero_optimization' is set by the plan"),
        ({"deepspeed": {"overrides": {"bfloat16.enabled": True}}}, "key 'bfloat16.enabled' is set by the plan"),
        ({"deepspeed": {"overrides": {"elasticity.enabled": True}}}, "key 'elasticity.enabled' is set by the plan"),
        ({"deepspeed": {"overrides": {"amp.enabled": True}}}, "spec.deepspeed.overrides: key 'amp.enabled' is set"),
        ({"deepspeed": {"overrides": {"zero_optimization.offload_param.device": "cpu"}}}, "spec.deepspeed.overrides:"),
        (
            {"training": {"globalBatchSize": 8}, "resources": {"numNodes": 2, "gpusPerNode": 8}},
            "spec.training.globalBatchSize: must be a multiple of the world size",
        ),
        (
            {"training": {"globalBatchSize": 24}, "resources": {"numNodes": 2, "gpusPerNode": 8}},
            "spec.training.globalBatchSize: must be a multiple of the world size",
        ),
        (
            {"training": {"globalBatchSize": 3}, "resources": {"numNodes": 2, "gpusPerNode": 0}},
            "spec.training.globalBatchSize: must be a multiple of the world size",
        ),
        ({"output": {"uri": "pvc://out/../../x"}}, "spec.output.uri: must not contain a '..' path segment"),
        ({"dataset": {"uri": "pvc://data/../out/x"}}, "spec.dataset.uri: must not contain a '..'"),
        ({"dataset": {"uri": "/d/t.jsonl", "validationUri": "pvc://d/.."}}, "spec.dataset.validationUri: must not"),
        ({"model": {"uri": "/models/../etc"}}, "spec.model.uri: must not contain a '..'"),
        ({"model": {"uri": "org/m", "tokenizer": "hf://org/.."}}, "spec.model.tokenizer: must not contain a '..'"),
        ({"method": {"type": "qlora"}, "training": {"precision": "fp32"}}, "spec.training.precision: qlora needs"),
        ({"method": {"type": "lora", "qlora": {}}}, "spec.method.qlora: qlora settings are only allowed"),
        ({"method": {"type": "full", "lora": {"r": 8}}}, "spec.method.lora: lora settings are not allowed"),
        ({"model": {"uri": "not a uri"}}, "spec.model.uri: invalid value 'not a uri': must be a hub id"),
        ({"model": DELETE}, "spec.model: required"),
        ({"output": {"uri": "s3://bucket"}}, "spec.output.uri: invalid value 's3://bucket': must be pvc://"),
        ({"env": [{"name": "WORLD_SIZE", "value": "4"}]}, "spec.env[0].name: this name is reserved"),
        ({"env": [{"name": "A"}]}, "spec.env[0]: set exactly one of value and valueFrom"),
        ({"env": [{"name": "A", "value": "x" * 4097}]}, "spec.env[0].value: "),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.env: env names must be unique"),
        ({"env": [{"name": "1BAD", "value": "x"}]}, "spec.env[0].name: invalid value '1BAD': must be a C identifier"),
        ({"training": {"sead": 1}}, "spec.training.sead: unknown field (allowed: checkpointEverySteps"),
        ({"suspend": "maybe"}, "spec.suspend:"),
        ({"failurePolicy": {"onOutOfMemory": "Retry"}}, "spec.failurePolicy.onOutOfMemory: must be one of"),
        ({"resources": {"gpuMemory": "9" * 400 + "Gi"}}, "spec.resources.gpuMemory: not a Kubernetes quantity: '999"),
        ({"resources": {"gpuMemory": 10**30}}, "spec.resources.gpuMemory: must be a Kubernetes quantity"),
        ({"resources": {"nodeSelector": {"bad key!": "x"}}}, "spec.resources.nodeSelector: key 'bad key!' is not a"),
        ({"resources": {"nodeSelector": {"a": "bad value!"}}}, "spec.resources.nodeSelector.a: invalid value 'bad "),
        (
            {"resources": {"tolerations": [{"key": "-x", "operator": "Exists"}]}},
            "spec.resources.tolerations[0].key: invalid value '-x': must be a label key",
        ),
        ({"podTemplate": {"nodeSelector": {"a/b/c": "x"}}}, "spec.podTemplate.nodeSelector: key 'a/b/c' is not a"),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, Any], expected: str) -> None:
    lines = problems(**spec)
    assert any(line.startswith(expected) or expected in line for line in lines), lines
    assert all(": " in line and "Traceback" not in line for line in lines)


@pytest.mark.parametrize("name", RESERVED_ENV)
def test_every_reserved_env_name_is_rejected(name: str) -> None:
    assert problems(env=[{"name": name, "value": "x"}]) != []


@pytest.mark.parametrize("value", [True, False, "auto", "true", "false"])
def test_gradient_checkpointing_accepts_yaml_booleans(value: object) -> None:
    job = make_job(training={"gradientCheckpointing": value})
    assert job.spec.training.gradient_checkpointing == str(value).lower()


@pytest.mark.parametrize(
    ("uri", "ok"),
    [
        ("meta-llama/Llama-3.1-8B", True),
        ("hf://Qwen/Qwen2.5-7B", True),
        ("pvc://models/llama/7b", True),
        ("/models/llama", True),
        ("file:///models/llama", True),
        ("builtin://tiny-llama", True),
        ("builtin://smollm2-135m-instruct", True),
        ("builtin://reverse-words", False),
        ("builtin://nope", False),
        ("http://example.com/x", False),
        ("../etc/passwd", False),
        ("pvc://Bad_Claim/x", False),
        ("a b/c", False),
    ],
)
def test_model_uri_forms(uri: str, ok: bool) -> None:
    assert (problems(model={"uri": uri}) == []) is ok


@pytest.mark.parametrize(
    ("uri", "ok"),
    [("builtin://reverse-words", True), ("builtin://secret-code", True), ("builtin://tiny-llama", False)],
)
@pytest.mark.parametrize("field", ["uri", "validationUri"])
def test_dataset_builtin_names(field: str, uri: str, ok: bool) -> None:
    found = problems(dataset={"uri": "builtin://reverse-words", field: uri})
    assert (found == []) is ok
    if not ok:
        assert f"spec.dataset.{field}" in str(found) and "builtin://secret-code" in str(found)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("80Gi", 80 * 2**30),
        ("24Gi", 24 * 2**30),
        ("1.5Gi", int(1.5 * 2**30)),
        ("80G", 80 * 10**9),
        (8, 8),
        ("512Mi", 2**29),
    ],
)
def test_quantities(quantity: str | int, expected: int) -> None:
    assert quantity_bytes(quantity) == expected


def test_milli_quantity_is_fractional() -> None:
    assert parse_quantity("500m") == parse_quantity("0.5")


def test_world_size_counts_cpu_ranks_as_one_per_pod() -> None:
    assert make_job(resources={"numNodes": 2, "gpusPerNode": 0}).spec.world_size == 2
    assert make_job(resources={"numNodes": 4, "gpusPerNode": 8}).spec.world_size == 32


@pytest.mark.parametrize("name", ["Job", "-job", "job-", "j" * 53, "job.x"])
def test_bad_names_are_rejected(name: str) -> None:
    doc = job_document()
    doc["metadata"]["name"] = name
    with pytest.raises(ValidationError) as info:
        FineTuneJob.from_manifest(doc)
    assert any(line.startswith("metadata.name:") for line in describe(info.value, FineTuneJob))


@pytest.mark.parametrize(
    ("training", "total", "expected"),
    [
        ({"warmupRatio": 0.1667}, 60, 10),  # 10.002 rounds to 10, not up to 11
        ({"warmupRatio": 0.175}, 60, 11),  # 10.5 rounds half up
        ({"warmupRatio": 0.0}, 60, 0),
        ({}, 200, 6),  # the default ratio 0.03
        ({"warmupSteps": 7}, 60, 7),
        ({"warmupSteps": 100}, 60, 60),  # never more than the run
    ],
)
def test_warmup_steps_from_a_ratio_round_to_nearest_or_are_given(
    training: dict[str, Any], total: int, expected: int
) -> None:
    assert make_job(training=training).spec.training.warmup_steps_of(total) == expected


@pytest.mark.parametrize(
    ("dataset", "fraction"),
    [
        ({}, 0.05),
        ({"validationSplit": 0.2}, 0.2),
        ({"validationUri": "pvc://data/val.jsonl"}, 0.0),  # a separate eval set: train on every record
    ],
)
def test_held_out_fraction(dataset: dict[str, Any], fraction: float) -> None:
    assert make_job(dataset=dataset).spec.dataset.held_out_fraction == fraction


@pytest.mark.parametrize("depth", [65, 5000])
def test_a_deeply_nested_value_is_refused_naming_its_field_at_any_depth(depth: int) -> None:
    import sys

    value: Any = 1
    for _ in range(depth):
        value = [value]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(4 * depth + limit)  # the test's own deep copy of the document
    try:
        lines = problems(deepspeed={"overrides": {"zero_optimization.x": value}}, podTemplate={"affinity": {"a": {}}})
    finally:
        sys.setrecursionlimit(limit)
    assert lines == ["spec.deepspeed.overrides.zero_optimization.x: nested deeper than 64 levels of lists and objects"]


def test_nesting_within_the_limit_is_judged_by_the_schema() -> None:
    value: Any = 1
    for _ in range(40):
        value = [value]
    lines = problems(deepspeed={"overrides": {"zero_optimization.x": value}})
    assert lines and all(line.startswith("spec.deepspeed.overrides.zero_optimization.x") for line in lines), lines
    assert not any("nested deeper" in line for line in lines)
