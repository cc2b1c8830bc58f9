"""End to end through the process node: today's model families, read from a claim or the hub.

One module-scoped cluster (a process node and the local-path provisioner) and the local hub
stand-in; each restricted namespace gets an operator pointed at that hub. Tiny random models of
three families the first catalogue lacked (Qwen3, Gemma 3 text, Qwen3-MoE) are built with
`from_config` and saved to a claim; each job is planned from its own config.json, read by the
inspector pod, with the plan's trainable count equal to the meta-device model's and to the
adapter it saves, and runs and succeeds (the three at once, without a restart).
A hub model is downloaded into each pod's cache claim: a gang restart downloads 0 bytes of it
again, and deleting the job deletes the claim. A gated model without a token fails naming
`hfTokenSecretRef`.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster import PROCESS_NODE_PLACEMENT, Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim, install_crd
from finetune_localcluster.hub_server import HubServer
from finetune_localcluster.local_provisioner import STORAGE_CLASS
from tests.cluster.operator_harness import Jobs, namespaces
from tests.cluster.process_jobs import worker_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

LORA_R = 8
COMMON = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {},
    "gemma3_text": {"sliding_window": 32, "query_pre_attn_scalar": 16},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
}
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def build_tiny(model_type: str, folder: Path) -> dict[str, Any]:
    """A random tiny model of `model_type` with the demo's tokenizer (and its chat template), saved."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from finetune_trainer.model.builtin_models import build_tokenizer

    config = AutoConfig.for_model(model_type, **COMMON, **FAMILIES.get(model_type, {}))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    build_tokenizer(COMMON["vocab_size"]).save_pretrained(folder)
    saved: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return saved


def job_spec(model_uri: str, output: str, max_steps: int, **training: Any) -> dict[str, Any]:
    """LoRA on the reverse-words demo task, nothing held out (no evaluation: the job is only run)."""
    return {
        "model": {"uri": model_uri},
        "dataset": {"uri": "builtin://reverse-words", "format": "messages", "maxSeqLength": 48, "validationSplit": 0},
        "method": {"type": "lora", "lora": {"r": LORA_R, "alpha": 2 * LORA_R}},
        # fp32: without AVX-512 BF16 or AMX a CPU computes bf16 matmuls several times slower
        # (benchmarks/cpu_precision.py); precision is not what these tests are about
        "training": {
            "maxSteps": max_steps,
            "microBatchSize": 4,
            "globalBatchSize": 4,
            "seed": 7,
            "precision": "fp32",
            **training,
        },
        "resources": {"numNodes": 1, "gpusPerNode": 0, **PROCESS_NODE_PLACEMENT},
        "output": {"uri": f"pvc://ftjob-output/{output}"},
    }


@dataclass
class Stack:
    cluster: LocalCluster
    kube: Kube
    hub: HubServer


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    keep = os.environ.get("FTJOB_KEEP_CLUSTER_LOGS") == "1"
    with HubServer() as hub, LocalCluster(gpu_nodes=0, process_nodes=1, keep_workdir=keep) as cluster:
        kube = cluster.kube()
        try:
            install_crd(kube)
            yield Stack(cluster, kube, hub)
        finally:
            kube.close()


@pytest.fixture
def namespaced(stack: Stack, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Jobs]]:
    """`new()`: a restricted namespace with the `models` and output claims, and its own operator.

    One operator per namespace, each with its own rendezvous port: the process node runs every
    pod in the host's network namespace, where torch's rendezvous store listens on every address,
    so jobs running at once under one operator (one port) would collide; on a cluster each pod
    has its own network namespace."""
    operators: list[OperatorProcess] = []
    with namespaces(stack.kube, f"t-{request.node.name[5:20].replace('_', '-')}") as make:
        try:

            def new() -> Jobs:
                ns = make(restricted=True)
                for claim in ("models", "ftjob-output"):
                    bind_claim(stack.kube, ns, claim)
                operator = OperatorProcess(
                    stack.cluster.kubeconfig,
                    tmp_path / f"operator-{ns}.log",
                    extra_args=("--namespace", ns, "--hub-endpoint", stack.hub.endpoint,
                                "--model-cache-storage-class", STORAGE_CLASS),
                    unset_env=OFFLINE_ENV,
                )  # fmt: skip
                operators.append(operator)
                operator.start()
                return Jobs(stack.kube, ns)

            yield new
            failed = getattr(request.node, "rep_call", None)
            if failed is not None and failed.failed:
                for operator in operators:
                    print(operator.log_path.name, operator.log_tail(80), sep="\n")
        finally:
            for operator in operators:
                operator.stop()


def claim_folder(stack: Stack, ns: str, claim: str) -> Path:
    return stack.cluster.workdir / "pvc" / ns / claim


def test_three_new_families_from_a_claim_are_planned_from_their_config_and_train(
    stack: Stack, namespaced: Callable[[], Jobs]
) -> None:
    from safetensors.torch import load_file

    from finetune_operator.plan.counting.meta_count import count_on_meta

    families = {family: namespaced() for family in FAMILIES}
    names = {family: family.replace("_", "-") for family in FAMILIES}
    configs = {
        family: build_tiny(family, claim_folder(stack, jobs.ns, "models") / family) for family, jobs in families.items()
    }
    for family, jobs in families.items():
        jobs.create(names[family], **job_spec(f"pvc://models/{family}", names[family], max_steps=2))
    meta_trainable: dict[str, int] = {}
    for family, jobs in families.items():
        name = names[family]
        status = jobs.wait(lambda s: s.get("plan") is not None, f"{name} planned", name=name, timeout=300)
        planned = {c["type"]: c for c in status["conditions"]}["Planned"]
        assert planned["status"] == "True", planned
        meta = count_on_meta(configs[family], LORA_R, ["all-linear"])
        assert status["plan"]["trainableParameters"] == meta.trainable, (family, status["plan"], meta)
        meta_trainable[family] = meta.trainable
    for family, jobs in families.items():
        name = names[family]
        status = jobs.wait_state("Succeeded", name=name, timeout=900)
        assert status["result"]["steps"] == 2 and status.get("restarts", 0) == 0, status
        assert {"Planned", "AllRanksRunning", "Completed"} <= jobs.wait_events({"Completed"}, name=name)
        out = claim_folder(stack, jobs.ns, "ftjob-output") / name
        adapter = load_file(out / "adapter" / "adapter_model.safetensors")
        assert sum(t.numel() for t in adapter.values()) == meta_trainable[family]  # what trained is what was planned
        record = stack.kube.get(f"/api/v1/namespaces/{jobs.ns}/configmaps/{name}-model")
        assert json.loads(record["data"]["config.json"]) == configs[family]  # the claim's config.json, as read
        pods = stack.kube.items(f"/api/v1/namespaces/{jobs.ns}/pods")
        assert not [p for p in pods if p["metadata"]["name"] == f"{name}-model-inspector"]  # deleted once read


def test_a_restarted_gang_downloads_nothing_it_already_has_and_the_cache_goes_with_the_job(
    stack: Stack, namespaced: Callable[[], Jobs], tmp_path: Path
) -> None:
    jobs = namespaced()
    folder = tmp_path / "tiny-qwen3"
    build_tiny("qwen3", folder)
    stack.hub.add_folder("org/tiny-qwen3", folder)
    jobs.create("hub-qwen3", **job_spec("org/tiny-qwen3", "hub-qwen3", max_steps=4, checkpointEverySteps=2))
    status = jobs.wait(lambda s: s.get("plan") is not None, "planned from the hub", name="hub-qwen3", timeout=120)
    assert status["plan"]["modelBytes"] == sum(p.stat().st_size for p in folder.iterdir())  # every file it has
    planning = stack.hub.downloaded("org/tiny-qwen3")  # the operator read config.json, nothing else
    assert planning == (folder / "config.json").stat().st_size
    pids = wait_for(lambda: worker_pids("hub-qwen3-0", jobs.ns) or None, 600, "the rank of pod hub-qwen3-0")
    first = stack.hub.downloaded("org/tiny-qwen3")
    assert first - planning == status["plan"]["modelBytes"]  # the pod's download, before its ranks started
    claim_path = f"/api/v1/namespaces/{jobs.ns}/persistentvolumeclaims/model-cache-hub-qwen3-0"
    claim = stack.kube.get(claim_path)
    assert claim["spec"]["storageClassName"] == STORAGE_CLASS and claim["status"]["phase"] == "Bound"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    status = jobs.wait_state("Succeeded", name="hub-qwen3", timeout=900)
    assert status["restarts"] == 1, status
    assert stack.hub.downloaded("org/tiny-qwen3") == first  # the restarted gang downloaded 0 bytes
    assert stack.kube.get(claim_path)["metadata"]["uid"] == claim["metadata"]["uid"]  # the same claim, kept
    stack.kube.delete(f"/apis/finetune.dev/v1alpha1/namespaces/{jobs.ns}/finetunejobs/hub-qwen3")
    wait_for(lambda: stack.kube.get_or_none(claim_path) is None, 120, "the cache claim to go with the job")


def test_a_gated_hub_model_without_a_token_fails_naming_hf_token_secret_ref(
    stack: Stack, namespaced: Callable[[], Jobs]
) -> None:
    jobs = namespaced()
    stack.hub.add_commit("org/gated-model", {"config.json": b"{}", "model.safetensors": b"\0"}, gated=True)
    jobs.create("gated", **job_spec("org/gated-model", "gated", max_steps=1))
    status = jobs.wait_state("Failed", name="gated", timeout=60)
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "ModelGated" and "set spec.hfTokenSecretRef" in failed["message"], failed
    assert not jobs.pods("gated") and jobs.statefulset("gated") is None  # nothing was started
