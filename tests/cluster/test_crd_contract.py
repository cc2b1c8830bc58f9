"""The generated FineTuneJob CRD against the real kube-apiserver.

The unit tier checks the schema offline (structural rules, cel-python); here the
apiserver itself must establish the CRD, compile every CEL rule, accept every valid
example, reject bad documents with a message naming the field, enforce immutability,
serve the status subresource and print the columns.
"""

from __future__ import annotations

import copy
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube, KubeError, wait_for
from finetune_localcluster.binaries import cached_binaries
from finetune_operator.api import FineTuneJob
from tests.factories import BASE_JOB, job_document
from tests.support.job_menu import ABSENT, MENU, OPERATOR_CHECKED, parse_job, set_field

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOBS = "/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs"


def create(kube: Kube, ns: str, doc: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    body = copy.deepcopy(doc)
    body["metadata"]["namespace"] = ns
    path = JOBS.format(ns=ns) + ("?dryRun=All" if dry_run else "")
    return kube.create(path, body)


def rejection(kube: Kube, ns: str, doc: dict[str, Any]) -> str:
    with pytest.raises(KubeError) as info:
        create(kube, ns, doc, dry_run=True)
    assert info.value.status == 422
    return str(info.value)


def test_crd_is_established_with_status_subresource(crd: dict[str, Any]) -> None:
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"] == ["ftj"]


@pytest.mark.parametrize(
    "example", sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "invalid.yaml"), ids=lambda p: p.name
)
def test_every_example_is_accepted(crd: dict[str, Any], kube: Kube, namespace: str, example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        created = create(kube, namespace, doc)
        assert created["metadata"]["uid"]
        FineTuneJob.from_manifest(created)  # what the apiserver stored still parses


def test_invalid_example_is_rejected_naming_each_field(crd: dict[str, Any], kube: Kube, namespace: str) -> None:
    doc = yaml.safe_load((EXAMPLES / "invalid.yaml").read_text())
    message = rejection(kube, namespace, doc)
    for field in (
        "spec.model.uri",
        "spec.dataset.format",
        "spec.method.lora.r",
        "spec.training.precision",
        "spec.resources.numNodes",
        "spec.resources.gpuMemory",
        "spec.deepspeed.zeroStage",
    ):
        assert field in message, message


CEL_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"method": {"type": "qlora"}, "training": {"precision": "fp32"}}, "spec.training.precision", "16-bit"),
    ({"deepspeed": {"zeroStage": 2, "offloadParams": "cpu"}}, "spec.deepspeed.offloadParams", "only at ZeRO-3"),
    ({"deepspeed": {"offloadOptimizer": "nvme"}}, "spec.deepspeed.nvmePath", "needs nvmePath"),
    ({"deepspeed": {"zeroStage": 0, "offloadOptimizer": "cpu"}}, "spec.deepspeed.offloadOptimizer", "ZeRO stage"),
    ({"env": [{"name": "MASTER_ADDR", "value": "x"}]}, "spec.env[0].name", "reserved"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.env", "unique"),
    ({"env": [{"name": "A"}]}, "spec.env[0]", "exactly one of value and valueFrom"),
    ({"training": {"epochs": 1, "maxSteps": 2}}, "spec.training.maxSteps", "not both"),
    ({"training": {"globalBatchSize": 10, "microBatchSize": 4}}, "spec.training.globalBatchSize", "multiple"),
    ({"method": {"type": "lora", "qlora": {}}}, "spec.method.qlora", "only allowed"),
    ({"method": {"type": "full", "lora": {"r": 4}}}, "spec.method.lora", "not allowed"),
    (
        {"training": {"globalBatchSize": 8}, "resources": {"numNodes": 2, "gpusPerNode": 8}},
        "spec.training.globalBatchSize",
        "multiple of the world size",
    ),
    (
        {"training": {"globalBatchSize": 3}, "resources": {"numNodes": 2, "gpusPerNode": 0}},
        "spec.training.globalBatchSize",
        "multiple of the world size",
    ),
    ({"output": {"uri": "pvc://out/../../x"}}, "spec.output.uri", "'..' path segment"),
    ({"dataset": {"uri": "pvc://out/../x"}}, "spec.dataset.uri", "'..' path segment"),
    ({"model": {"uri": "/m/x", "tokenizer": "pvc://t/a/../b"}}, "spec.model.tokenizer", "'..' path segment"),
    ({"deepspeed": {"offloadOptimizer": "nvme", "nvmePath": "/"}}, "spec.deepspeed.nvmePath", "dedicated directory"),
    ({"deepspeed": {"offloadParams": "nvme", "nvmePath": "/dev/shm"}}, "spec.deepspeed.nvmePath", "dedicated dir"),
    # preference tuning: method.type dpo/orpo, the adaptation in method.preference.base
    ({"method": {"type": "dpo"}}, "spec.dataset.format", "read preference pairs"),
    ({"dataset": {"format": "preference"}}, "spec.method.type", "set method.type to dpo or orpo"),
    ({"method": {"type": "lora", "preference": {}}}, "spec.method.preference", "only allowed when type is dpo"),
    (
        {"method": {"type": "orpo", "preference": {"lossType": "ipo"}}, "dataset": {"format": "preference"}},
        "spec.method.preference.lossType",
        "only allowed when type is dpo",
    ),
    (
        {"method": {"type": "dpo", "preference": {"precomputeReference": True}}, "dataset": {"format": "preference"}},
        "spec.method.preference.precomputeReference",
        "preference.base is full",
    ),
    (
        {
            "method": {"type": "dpo", "preference": {"base": "qlora"}},
            "dataset": {"format": "preference"},
            "training": {"precision": "fp32"},
        },
        "spec.training.precision",
        "16-bit",
    ),
    (
        {
            "method": {"type": "orpo", "preference": {"base": "full"}, "lora": {"r": 4}},
            "dataset": {"format": "preference"},
        },
        "spec.method.lora",
        "not allowed",
    ),
    (
        {"method": {"type": "dpo", "qlora": {}}, "dataset": {"format": "preference"}},
        "spec.method.qlora",
        "only allowed",
    ),
    # starting from an adapter: only a method that has one, only where an adapter can be read from
    (
        {"model": {"uri": "/m/x", "adapter": "pvc://out/sft/adapter"}, "method": {"type": "full"}},
        "spec.model.adapter",
        "takes no adapter",
    ),
    (
        {
            "model": {"uri": "/m/x", "adapter": "/out/sft/adapter"},
            "method": {"type": "dpo", "preference": {"base": "full"}},
            "dataset": {"format": "preference"},
        },
        "spec.model.adapter",
        "takes no adapter",
    ),
    ({"model": {"uri": "/m/x", "adapter": "pvc://out/a/../../b"}}, "spec.model.adapter", "'..' path segment"),
    # serving: what the runtime cannot serve is refused at the door, naming the field
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
    (  # lora.r defaults to 16: above a maxLoraRank of 8
        {"serving": {"target": "LLMInferenceService", "maxLoraRank": 8}},
        "spec.serving.maxLoraRank",
        "raise serving.maxLoraRank",
    ),
]


@pytest.mark.parametrize(("spec", "field", "words"), CEL_CASES, ids=[c[1] + ":" + c[2] for c in CEL_CASES])
def test_cel_rules_fire_with_the_models_message(
    crd: dict[str, Any], kube: Kube, namespace: str, spec: dict[str, Any], field: str, words: str
) -> None:
    doc = job_document(**spec)
    message = rejection(kube, namespace, doc)
    assert field in message and words in message, message
    _, lines = parse_job(doc)
    assert any(line.startswith(field + ":") and words in line for line in lines), lines


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": {"uri": "other/model"}}, "spec.model"),
        ({"training": {"seed": 7}}, "spec.training"),
        ({"resources": {"gpusPerNode": 4}}, "spec.resources.gpusPerNode"),
        ({"method": {"type": "full"}}, "spec.method"),
    ],
)
def test_started_jobs_keep_their_immutable_fields(
    crd: dict[str, Any], kube: Kube, namespace: str, change: dict[str, Any], field: str
) -> None:
    create(kube, namespace, job_document())
    with pytest.raises(KubeError) as info:
        kube.merge_patch(JOBS.format(ns=namespace) + "/job", {"spec": change})
    assert info.value.status == 422 and field in str(info.value) and "immutable" in str(info.value)


def test_mutable_fields_can_change(crd: dict[str, Any], kube: Kube, namespace: str) -> None:
    create(kube, namespace, job_document())
    patched = kube.merge_patch(
        JOBS.format(ns=namespace) + "/job",
        {
            "spec": {
                "suspend": True,
                "deepspeed": {"zeroStage": 3},
                "failurePolicy": {"backoffLimit": 9},
                "resources": {"numNodes": 4},  # the global batch (32) stays a multiple of the world
            }
        },
    )
    assert (
        patched["spec"]["suspend"] is True
        and patched["spec"]["resources"]["numNodes"] == 4
        and patched["metadata"]["generation"] == 2
    )


@pytest.mark.parametrize(
    "full",
    [
        {"method": {"type": "full"}},
        {"method": {"type": "dpo", "preference": {"base": "full"}}, "dataset": {"format": "preference"}},
    ],
    ids=["sft", "dpo"],
)
def test_full_fine_tuning_changes_its_world_size_where_the_checkpoint_converts(
    crd: dict[str, Any], kube: Kube, namespace: str, full: dict[str, Any]
) -> None:
    """Full fine-tuning's DeepSpeed shards are converted to a universal checkpoint for the new
    world size; a pinned ZeRO-0 (or NVMe offload) cannot be, and the apiserver says so. A DPO job
    whose preference.base is full is full fine-tuning too."""
    create(kube, namespace, job_document(**full))
    path = JOBS.format(ns=namespace) + "/job"
    patched = kube.merge_patch(path, {"spec": {"resources": {"numNodes": 2}}})
    assert patched["spec"]["resources"]["numNodes"] == 2
    kube.merge_patch(path, {"spec": {"deepspeed": {"zeroStage": 0}}})
    with pytest.raises(KubeError) as info:
        kube.merge_patch(path, {"spec": {"resources": {"numNodes": 1}}})
    assert info.value.status == 422 and "spec.resources.numNodes" in str(info.value), str(info.value)
    assert "deepspeed.zeroStage 0" in str(info.value)


def test_status_subresource_and_printer_columns(
    crd: dict[str, Any], kube: Kube, namespace: str, kubeconfig: Path
) -> None:
    create(kube, namespace, job_document(resources={"numNodes": 2, "gpusPerNode": 8}))
    path = JOBS.format(ns=namespace) + "/job"
    # status written through the main resource is ignored; through /status it sticks
    kube.merge_patch(path, {"status": {"restarts": 99}})
    assert (kube.get(path).get("status") or {}).get("restarts") != 99
    status = {"state": "Running", "topology": "2×8", "restarts": 1,
              "plan": {"zeroStage": 3, "offloadOptimizer": "none", "offloadParams": "none",
                       "gradientCheckpointing": True, "microBatchSize": 2, "gradientAccumulationSteps": 4,
                       "perGpuBytes": 1, "gpuMemoryBytes": 2},
              "progress": {"step": 120, "totalSteps": 500, "summary": "120/500 (24%)", "loss": 1.2345},
              "workers": {"ready": 2, "total": 2, "summary": "2/2"}}  # fmt: skip
    kube.merge_patch(path + "/status", {"status": status})
    kubectl = str(cached_binaries().kubectl)

    def table() -> tuple[str, str, dict[str, Any]] | None:
        # an operator may be running and rewrite the status: compare with what is stored now
        out = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "get", "ftj", "-n", namespace, "-o", "wide"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        stored = kube.get(path).get("status") or {}
        header, row = out.splitlines()[:2]
        expected = [str(stored.get("state", "")), str(stored.get("topology", ""))]
        return (header, row, stored) if all(v in row for v in expected) else None

    header, row, stored = wait_for(table, 30, "kubectl get ftj to show the stored status")
    for column in ("STATUS", "NODES×GPUS", "ZERO", "PROGRESS", "LOSS", "AGE", "WORKERS", "RESTARTS"):
        assert column in header, header
    assert stored.get("state") and stored["state"] in row and "×" in row, row


def test_status_rejects_nonsense_types(crd: dict[str, Any], kube: Kube, namespace: str) -> None:
    create(kube, namespace, job_document())
    with pytest.raises(KubeError) as info:
        kube.merge_patch(JOBS.format(ns=namespace) + "/job/status", {"status": {"restarts": "many"}})
    assert "restarts" in str(info.value)


def _sample(rng: random.Random) -> dict[str, Any]:
    doc = copy.deepcopy(BASE_JOB)
    for dotted, values in MENU.items():
        value = rng.choice(values)
        if value is not ABSENT:
            set_field(doc["spec"], dotted, copy.deepcopy(value))
    return doc


@pytest.mark.parametrize("seed", range(4))
def test_models_and_apiserver_agree_on_a_generated_corpus(
    crd: dict[str, Any], kube: Kube, namespace: str, seed: int
) -> None:
    rng = random.Random(seed)
    agreed = 0
    for _ in range(25):
        doc = _sample(rng)
        job, lines = parse_job(doc)
        try:
            create(kube, namespace, doc, dry_run=True)
            accepted, message = True, ""
        except KubeError as exc:
            accepted, message = False, str(exc)
        if job is None and accepted and all(line.startswith(OPERATOR_CHECKED) for line in lines):
            continue  # checked by the operator, which answers Failed/InvalidSpec
        assert (job is not None) == accepted, f"pydantic: {lines or 'accepted'}; apiserver: {message or 'accepted'}"
        agreed += 1
    assert agreed >= 20


_S3 = {"objectStorage": {"credentials": {"secretName": "s3-keys"}}}
HOSTILE_VALUES: list[tuple[str, dict[str, Any]]] = [
    ("experiment after U+0085", {"tracking": {"mlflow": {"experiment": "\x85lead"}}}),
    ("experiment after NBSP", {"tracking": {"mlflow": {"experiment": "\xa0lead"}}}),
    ("experiment after a vertical tab", {"tracking": {"mlflow": {"experiment": "\x0blead"}}}),
    ("path with a vertical tab", {"output": {"uri": "pvc://out/a\x0bb"}}),
    ("image with U+0085", {"image": "ghcr.io/x\x85y"}),
    ("Secret key ..", {"hfTokenSecretRef": {"name": "hf", "key": ".."}}),
    ("Secret key ..x", {"hfTokenSecretRef": {"name": "hf", "key": "..x"}}),
    ("empty key segment", {**_S3, "output": {"uri": "s3://runs//"}}),
    ("bucket a..b", {**_S3, "output": {"uri": "s3://a..b/x"}}),
    ("bucket in IP form", {**_S3, "output": {"uri": "s3://10.1.2.3/x"}}),
    ("bucket xn--", {**_S3, "output": {"uri": "s3://xn--b/x"}}),
    ("bucket --ol-s3", {**_S3, "output": {"uri": "s3://b--ol-s3/x"}}),
    ("endpoint port 99999", {"objectStorage": {"endpoint": "http://s3:99999"}}),
    ("revision a..b", {"model": {"uri": "org/model", "revision": "a..b", "architecture": "meta-llama/Llama-3.1-8B"}}),
    ("HF_ENDPOINT without a scheme", {"env": [{"name": "HF_ENDPOINT", "value": "hf-mirror.example.com"}]}),
]


@pytest.mark.parametrize(("what", "spec"), HOSTILE_VALUES, ids=[w for w, _ in HOSTILE_VALUES])
def test_the_apiserver_refuses_at_apply_what_validate_refuses(
    crd: dict[str, Any], kube: Kube, namespace: str, what: str, spec: dict[str, Any]
) -> None:
    doc = job_document(**spec)
    job, lines = parse_job(doc)
    assert job is None and lines, what
    with pytest.raises(KubeError):
        create(kube, namespace, doc, dry_run=True)
