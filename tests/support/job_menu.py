"""A menu of valid, boundary and wrong values for every FineTuneJob spec field.

Documents drawn from it hold both accepted and rejected jobs: the unit tier's property tests
compare pydantic with the offline schema emulation on them, the cluster tier compares pydantic
with the real apiserver on a seeded sample.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from finetune_operator.api import FineTuneJob, describe

ABSENT = object()
"""A menu entry that leaves the field out."""

MENU: dict[str, list[Any]] = {
    "model.uri": [
        "meta-llama/Llama-3.1-8B",
        "hf://Qwen/Qwen2.5-7B",
        "/models/x",
        "builtin://tiny-llama",
        "x y",
        3,
        "org/model@main",
        "org/model@a..b",
        "s3://models/base/x",
        "s3://models//",
        "s3://a..b/x",
        "s3://10.0.0.1/x",
        "pvc://claim/\x85x",
        "/models/\x0bx",
    ],
    "model.revision": [ABSENT, None, "main", "v1.0", "-bad", "..", "a/../b", "v1."],
    "model.tokenizer": [ABSENT, "org/tok", "s3://models/tok/", "s3://xn--tok/x", "s3://tok--ol-s3/x"],
    "model.adapter": [
        ABSENT,
        "pvc://runs/sft/adapter",
        "s3://runs/sft/adapter/",
        "/out/sft/adapter",
        "org/adapter",
        "pvc://runs/../x",
        "builtin://tiny-llama",
    ],
    "model.cache": [
        ABSENT,
        {"size": "20Gi"},
        {"claimName": "cache", "storageClassName": "fast"},
        {"size": "20Gi "},
        {"claimName": "Bad_Claim"},
    ],
    "dataset.uri": [ABSENT, "s3://data/train.jsonl", "s3://data/a//b.jsonl", "s3://sthree-x/d", "pvc://data/x.jsonl"],
    "output.uri": [ABSENT, "s3://runs/job", "s3://runs/job/", "s3://runs//", "s3://runs-s3alias/x", "pvc://out/\xa0"],
    "model.trustRemoteCode": [ABSENT, True, False, "yes"],
    "dataset.format": [ABSENT, "alpaca", "sharegpt", "messages", "text", "csv", "preference", "preference"],
    "dataset.validationSplit": [ABSENT, 0, 0.1, 0.5, 0.51, -0.1],
    "dataset.maxSeqLength": [ABSENT, 16, 15, 4096, 131072, 131073, "long"],
    "dataset.packing": [ABSENT, True, False],
    "dataset.onMalformedLine": [ABSENT, "Fail", "Skip", "skip"],
    "method.type": [ABSENT, "lora", "qlora", "full", "dora", "dpo", "orpo", "dpo", "orpo"],
    "method.lora": [ABSENT, None, {}, {"r": 8, "alpha": 16}, {"r": 0}, {"r": 1025}, {"dropout": 1.0}],
    "method.qlora": [ABSENT, {}, {"quantType": "fp4", "doubleQuant": False}, {"computeDtype": "float32"}],
    "method.preference": [
        ABSENT,
        ABSENT,
        {},
        {"base": "full"},
        {"base": "qlora", "beta": 0.5},
        {"base": "lora", "lossType": "ipo"},
        {"base": "full", "precomputeReference": True},
        {"base": "lora", "precomputeReference": True},
        {"precomputeReference": False},
        {"beta": 0},
        {"beta": 10.5},
        {"base": "dora"},
        {"base": "dpo"},
        {"lossType": "hinge"},
    ],
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
        [{"name": "HF_ENDPOINT", "value": "https://hf-mirror.example.com/api/hf"}],
        [{"name": "HF_ENDPOINT", "value": "hf-mirror.example.com"}],
        [{"name": "HF_ENDPOINT", "value": "http://hub:99999"}],
        [{"name": "HF_ENDPOINT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "..k"}}}],
    ],
    "hfTokenSecretRef": [
        ABSENT,
        {"name": "hf", "key": "token"},
        {"name": "hf", "key": ".x"},
        {"name": "hf", "key": ".."},
        {"name": "hf", "key": "..x"},
        {"name": "hf", "key": "."},
    ],
    "objectStorage": [
        ABSENT,
        {"credentials": {"secretName": "s3-keys"}},
        {"serviceAccountName": "trainer"},
        {"credentials": {"secretName": "s3-keys"}, "serviceAccountName": "trainer"},
        {"credentials": {"secretName": "s3-keys", "accessKeyIdKey": "..id", "secretAccessKeyKey": "sk"}},
        {
            "endpoint": "http://127.0.0.1:8333",
            "region": "us-east-1",
            "pathStyle": True,
            "credentials": {"secretName": "s3-keys"},
        },
        {"endpoint": "http://s3.example.com:99999", "credentials": {"secretName": "s3-keys"}},
        {"endpoint": "https://s3.example.com/path", "serviceAccountName": "trainer"},
        {"region": "US_EAST", "serviceAccountName": "trainer"},
        {"caBundle": {"name": "ca", "key": "ca.crt"}, "serviceAccountName": "trainer", "retryTimeoutSeconds": 60},
        {"caBundle": {"name": "ca", "key": "."}, "serviceAccountName": "trainer", "retryTimeoutSeconds": 5},
    ],
    "tracking": [
        ABSENT,
        {"mlflow": {"trackingUri": "http://mlflow:5000", "experiment": "team a"}},
        {"mlflow": {"experiment": "\x85lead"}},
        {"mlflow": {"experiment": "\xa0lead"}},
        {"mlflow": {"experiment": "\x0blead"}},
        {"mlflow": {"experiment": "trail "}},
        {"mlflow": {"experiment": "a\tb"}},
        {"mlflow": {"trackingUri": "https://u:p@mlflow"}},
        {"mlflow": {"trackingUri": "http://mlflow:65536"}},
        {"mlflow": {"enabled": False, "secretRef": {"name": "ml", "tokenKey": "..t"}}},
        {"tensorboard": {"enabled": True}, "mlflow": {"secretRef": {"name": "ml", "tokenKey": "t.k"}}},
    ],
    "serving": [
        ABSENT,
        ABSENT,
        {"target": "InferenceService"},
        {"target": "Deployment", "maxLoraRank": 64, "gpus": 0, "args": ["--max-model-len=2048"]},
        {"target": "LLMInferenceService", "model": "merged"},
        {"target": "Deployment", "maxLoraRank": 24},
        {"target": "InferenceService", "image": "vllm/vllm-openai:v0.32.0"},
        {"target": "Deployment", "runtime": "kserve-huggingfaceserver"},
        {"target": "Knative"},
        {"target": "Deployment", "baseModelUri": "builtin://tiny-llama"},
        {"target": "Deployment", "name": "9lives"},
        {"target": "InferenceService", "model": "adapter", "maxLoraRank": 8},
    ],
    "queueName": [ABSENT, "team-a", "Team_A", "a" * 63, "a" * 64, "-a"],
    "suspend": [ABSENT, True, False],
    "failurePolicy": [ABSENT, {"backoffLimit": 0}, {"backoffLimit": 101}, {"onOutOfMemory": "Fail"}],
    "activeDeadlineSeconds": [ABSENT, None, 1, 0, 3600],
    "ttlSecondsAfterFinished": [ABSENT, 0, -1, 60],
    "surprise": [ABSENT, ABSENT, ABSENT, 1],
}

OPERATOR_CHECKED = ("spec.training.gradientCheckpointing:", "spec.deepspeed.overrides:")
"""Fields the structural schema cannot check (boolean-or-auto; free-form DeepSpeed keys): the
apiserver stores them and the operator answers a bad value with Failed/InvalidSpec."""


def set_field(spec: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `spec`'s field at the dotted path (`training.maxSteps`), creating parents."""
    parts = dotted.split(".")
    node = spec
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def parse_job(document: dict[str, Any]) -> tuple[FineTuneJob | None, list[str]]:
    """The job pydantic makes of a document, or None and its `path: message` lines."""
    try:
        return FineTuneJob.from_manifest(document), []
    except ValidationError as exc:
        return None, describe(exc, FineTuneJob)
