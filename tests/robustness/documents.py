"""Generated FineTuneJob documents: a valid job with one to three random mutations each.

Deterministic for a seed. The mutations are what careless or hostile users write: wrong types,
nulls, integral floats, Go/YAML integer spellings, out-of-range numbers, huge and odd strings,
paths out of a claim, unknown fields, deep nesting, bad labels and names.
"""

from __future__ import annotations

import copy
import random
from typing import Any

BASE: dict[str, Any] = {
    "apiVersion": "finetune.dev/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "fuzz", "labels": {"team": "ml"}},
    "spec": {
        "model": {"uri": "builtin://tiny-llama"},
        "dataset": {"uri": "builtin://reverse-words", "format": "messages", "maxSeqLength": 64,
                    "validationSplit": 0.02},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        "training": {"maxSteps": 10, "microBatchSize": 2, "globalBatchSize": 4, "learningRate": 0.001,
                     "checkpointEverySteps": 5, "seed": 42},
        "resources": {"numNodes": 2, "gpusPerNode": 1, "gpuMemory": "80Gi"},
        "deepspeed": {"zeroStage": 2},
        "output": {"uri": "pvc://out/fuzz"},
    },
}  # fmt: skip

PATHS: list[tuple[str, ...]] = [
    ("metadata", "name"),
    ("spec", "model", "uri"),
    ("spec", "model", "architecture"),
    ("spec", "model", "revision"),
    ("spec", "model", "trustRemoteCode"),
    ("spec", "model", "cache", "size"),
    ("spec", "dataset", "uri"),
    ("spec", "dataset", "format"),
    ("spec", "dataset", "maxSeqLength"),
    ("spec", "dataset", "validationSplit"),
    ("spec", "dataset", "validationUri"),
    ("spec", "dataset", "packing"),
    ("spec", "method"),
    ("spec", "method", "type"),
    ("spec", "method", "lora", "r"),
    ("spec", "method", "lora", "alpha"),
    ("spec", "method", "lora", "dropout"),
    ("spec", "method", "lora", "targetModules"),
    ("spec", "method", "qlora", "quantType"),
    ("spec", "method", "preference"),
    ("spec", "method", "preference", "base"),
    ("spec", "method", "preference", "beta"),
    ("spec", "method", "preference", "lossType"),
    ("spec", "method", "preference", "precomputeReference"),
    ("spec", "training"),
    ("spec", "training", "maxSteps"),
    ("spec", "training", "epochs"),
    ("spec", "training", "microBatchSize"),
    ("spec", "training", "globalBatchSize"),
    ("spec", "training", "learningRate"),
    ("spec", "training", "warmupRatio"),
    ("spec", "training", "warmupSteps"),
    ("spec", "training", "precision"),
    ("spec", "training", "seed"),
    ("spec", "training", "checkpointEverySteps"),
    ("spec", "training", "gradientCheckpointing"),
    ("spec", "resources", "numNodes"),
    ("spec", "resources", "gpusPerNode"),
    ("spec", "resources", "gpuMemory"),
    ("spec", "resources", "cpu"),
    ("spec", "resources", "memory"),
    ("spec", "resources", "nodeSelector"),
    ("spec", "resources", "tolerations"),
    ("spec", "resources", "priorityClassName"),
    ("spec", "deepspeed", "zeroStage"),
    ("spec", "deepspeed", "offloadOptimizer"),
    ("spec", "deepspeed", "nvmePath"),
    ("spec", "deepspeed", "overrides"),
    ("spec", "output", "uri"),
    ("spec", "image"),
    ("spec", "env"),
    ("spec", "suspend"),
    ("spec", "queueName"),
    ("spec", "failurePolicy", "backoffLimit"),
    ("spec", "activeDeadlineSeconds"),
    ("spec", "model", "tokenizer"),
    ("spec", "model", "adapter"),
    ("spec", "serving"),
    ("spec", "serving", "maxLoraRank"),
    ("spec", "serving", "baseModelUri"),
    ("spec", "model", "cache"),
    ("spec", "model", "cache", "claimName"),
    ("spec", "hfTokenSecretRef"),
    ("spec", "hfTokenSecretRef", "key"),
    ("spec", "objectStorage"),
    ("spec", "objectStorage", "endpoint"),
    ("spec", "objectStorage", "region"),
    ("spec", "objectStorage", "credentials", "secretName"),
    ("spec", "objectStorage", "credentials", "accessKeyIdKey"),
    ("spec", "objectStorage", "serviceAccountName"),
    ("spec", "objectStorage", "caBundle"),
    ("spec", "tracking"),
    ("spec", "tracking", "mlflow", "trackingUri"),
    ("spec", "tracking", "mlflow", "experiment"),
    ("spec", "tracking", "mlflow", "secretRef", "tokenKey"),
    ("spec", "tracking", "tensorboard", "enabled"),
]
"""Every field a tenant writes, including those added since the generator was first written:
object storage, tracking, model sources (tokenizer, cache, hub token) and the queue."""


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _value(rng: random.Random) -> Any:
    pool: list[Any] = [
        None, True, False, 0, 1, -1, 2, 3, 8, 42.0, 2.5, 0.5, 1e-4, 2**31, 2**63 + 1, 10**30, -(10**20),
        "", "auto", "abc", "0", "1", "80Gi", "500m", "1e3", "24Gi", "16Gi", "x" * 300, "x" * 5000,
        "lora", "qlora", "full", "cpu", "nvme", "none", "bf16", "fp8", "true", "messages", "alpaca",
        "dpo", "orpo", "preference", "sigmoid", "ipo", {"base": "full"}, {"beta": 0.1, "lossType": "ipo"},
        "pvc://out/../../x", "pvc://data/train.jsonl", "pvc://other/val.jsonl", "/etc/ftjob", "/dev/shm",
        "/", "/mnt/nvme", "file:///etc/passwd", "org/model", "hf://org/model", "builtin://tiny-llama",
        "s3://bucket/x", "UPPER", "bad value!", "a.b", "-lead", "trail-", "ünïcode", "line\nbreak",
        [], [1, 2], ["q_proj", "v_proj"], {}, {"a": 1}, {"zero_optimization": "off"},
        {"train_micro_batch_size_per_gpu": 4}, {"gradient_clipping": 1.0}, {"bfloat16": {"enabled": True}},
        {"kubernetes.io/hostname": "n1"}, {"bad key!": "x"}, {"team": "bad value!"},
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], [{"operator": "Exists"}],
        [{"name": "FOO", "value": "bar"}], [{"name": "DS_ACCELERATOR", "value": "cuda"}],
        [{"name": "1BAD", "value": "x"}], _deep(20), _deep(70),
        # object storage, tracking, model sources, queues
        "s3://bucket/", "s3://bucket//", "s3://bucket/a//b", "s3://a..b/x", "s3://192.168.1.1/x",
        "s3://xn--b/x", "s3://sthree-b/x", "s3://b-s3alias/x", "s3://b--ol-s3/x", "s3://models/tiny",
        "org/model@main", "org/model@a..b", "..", "..x", ".x", ".", "token", "us-east-1", "US_EAST",
        "http://127.0.0.1:8333", "http://s3:99999", "http://s3:0", "https://u:p@mlflow", "https://mlflow/x",
        "\x85lead", "\xa0lead", "\x0blead", "trail ", "team exp", "/a\x0bb", "pvc://out/\x85",
        {"credentials": {"secretName": "s3-keys"}}, {"serviceAccountName": "trainer"},
        {"credentials": {"secretName": "k"}, "serviceAccountName": "sa"}, {"name": "ca", "key": "ca.crt"},
        {"name": "hf", "key": ".."}, {"name": "hf", "key": "token"}, {"size": "20Gi"}, {"size": "20Gi "},
        {"mlflow": {"trackingUri": "http://mlflow:5000"}}, {"tensorboard": {"enabled": True}},
        [{"name": "HF_ENDPOINT", "value": "https://hf-mirror.example.com"}],
        [{"name": "HF_ENDPOINT", "value": "hf-mirror.example.com"}],
    ]  # fmt: skip
    return copy.deepcopy(rng.choice(pool))


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def _delete(doc: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = doc
    for key in path[:-1]:
        node = node.get(key)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


_SPACES = ["\x85", "\xa0", "\x0b", "\x0c", "\u2028", " ", "\t"]
r"""Characters Go's RE2 and Python's `re` once disagreed on (`\s`, `\S`)."""
_S3 = {"credentials": {"secretName": "s3-keys"}}
TARGETED: dict[tuple[str, ...], list[Any]] = {
    ("spec", "tracking", "mlflow", "experiment"): ["team a", *(c + "lead" for c in _SPACES), "trail\xa0"],
    ("spec", "tracking", "mlflow", "trackingUri"): ["http://mlflow:5000/x", "http://m:65535", "http://m:65536",
                                                    "http://m/a\x0bb", "http://m/a\x85b"],
    ("spec", "output", "uri"): ["s3://runs/job", "s3://runs//", "s3://a..b/x", "s3://xn--a/x", "s3://b--x-s3/y",
                                "pvc://out/a\x0bb", "pvc://out/a\x85b", "/out/\xa0"],
    ("spec", "model", "revision"): ["main", "v1.0", "a..b", "v1.", "refs/pr/1"],
    ("spec", "image"): ["ghcr.io/x/y:1", "x\x0by", "x\x85y"],
    ("spec", "hfTokenSecretRef", "key"): ["token", ".x", ".", "..", "..x"],
    ("spec", "objectStorage", "endpoint"): ["http://s3:8333", "http://s3:99999", "http://s3:0"],
    ("spec", "queueName"): ["team-a", "Team_A"],
    ("spec", "objectStorage"): [_S3, {"serviceAccountName": "trainer"}, {**_S3, "region": "eu-west-1"}],
}  # fmt: skip
"""Values chosen per field, so that the fields added since the generator was written meet their
boundary cases in most documents rather than by chance."""


def _mutate(doc: dict[str, Any], rng: random.Random) -> str:
    kinds = ["set", "targeted", "delete", "unknown", "label", "annotation"]
    kind = rng.choices(kinds, weights=[55, 25, 10, 4, 4, 2])[0]
    if kind in ("set", "targeted"):
        path = rng.choice(PATHS) if kind == "set" else rng.choice(list(TARGETED))
        value = _value(rng) if kind == "set" else copy.deepcopy(rng.choice(TARGETED[path]))
        _set(doc, path, value)
        return f"{'.'.join(path)}={value!r:.60}"
    if kind == "delete":
        path = rng.choice(PATHS)
        _delete(doc, path)
        return f"delete {'.'.join(path)}"
    if kind == "unknown":
        section = rng.choice(["spec", "spec.training", "spec.model", "spec.resources", "spec.objectStorage",
                              "spec.tracking.mlflow"])  # fmt: skip
        node = doc
        for key in section.split("."):
            node = node.setdefault(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node["surprise"] = 1
        return f"unknown field in {section}"
    where = "labels" if kind == "label" else "annotations"
    key = rng.choice(["team", "example.com/owner", "bad key!", "a" * 64, "x/" + "b" * 10, "-x"])
    value = rng.choice(["ml", "", "bad value!", "v" * 64, "v" * 63, 5, "ok-1.2_3"])
    doc["metadata"].setdefault(where, {})[key] = value
    return f"metadata.{where}[{key!r:.20}]={value!r:.20}"


def generate(count: int, seed: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """`count` documents as (what was mutated, document)."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    for _ in range(count):
        doc = copy.deepcopy(BASE)
        changes = [_mutate(doc, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        out.append(("; ".join(changes), doc))
    return out
