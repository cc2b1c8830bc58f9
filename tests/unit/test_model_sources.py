"""Where the operator gets a job's config.json, through the real Reconciler on an in-memory cluster.

A claim (or a hub id read with the job's token) goes through an inspector pod the job owns: the
job waits `Planned=False/InspectingModel`, plans from the pod's verdict, keeps it in its
`<job>-model` ConfigMap and deletes the pod; a verdict of failure fails the job with its reason.
A public hub id is read by the operator itself, through the real huggingface_hub client against
the local hub stand-in; one that does not answer is retried with backoff.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster.hub_server import HubServer
from finetune_operator.api.job import FineTuneJob
from finetune_operator.api.model_inspection import ModelInspection
from finetune_operator.api.reasons import MODEL_GATED
from finetune_operator.plan.sources.model_files import read_folder
from finetune_operator.reconcile.model_sources import HubSettings, ModelSources
from finetune_operator.reconcile.observed import Observed, observe, pod_view
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.support.cluster import FakeCluster, ignore_events, stored_job

pytestmark = pytest.mark.timeout(60)

CLAIM_JOB: dict[str, Any] = {"model": {"uri": "pvc://models/qwen3"}}
OPTIONS = RenderOptions(trainer_image="t", hub_endpoint="http://mirror.test")
TINY_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 160, "hidden_size": 64,
              "intermediate_size": 80, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 24, "tie_word_embeddings": False}  # fmt: skip


def conditions(store: FakeCluster) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in store.body.get("status", {}).get("conditions", [])}


def applied(store: FakeCluster, kind: str) -> list[dict[str, Any]]:
    return [o for objects in store.applied for o in objects if o["kind"] == kind]


def finished(pod: dict[str, Any], message: str, code: int = 0) -> Observed:
    """The inspector pod as the kubelet reports it once its container exited."""
    body = {**pod, "metadata": {**pod["metadata"], "uid": "insp-1"}}
    body["status"] = {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "inspector", "state": {"terminated": {
            "exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message,
            "finishedAt": "2026-01-01T00:00:00Z"}}}],
    }  # fmt: skip
    return Observed(workers=None, inspector=pod_view(body))


@pytest.fixture
def qwen3_folder(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    return tmp_path


def test_a_claim_model_is_read_by_a_restricted_inspector_pod_and_kept_in_a_config_map(qwen3_folder: Path) -> None:
    store = FakeCluster(stored_job(**CLAIM_JOB))
    reconciler = Reconciler(store, OPTIONS, ignore_events)
    reconciler.reconcile(store.job(), observe(None, []))
    planned = conditions(store)["Planned"]
    assert (planned["status"], planned["reason"]) == ("False", "InspectingModel")
    assert "job-model-inspector reads config.json from pvc://models/qwen3" in planned["message"]
    assert not applied(store, "StatefulSet")  # no GPU is taken while the model is read
    (pod,) = applied(store, "Pod")
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u1" and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["command"] == ["ftjob"] and "--folder" in container["args"]  # argv, never a shell
    assert container["args"][container["args"].index("--folder") + 1] == "/mnt/pvc/models/qwen3"
    assert {"name": "pvc-models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in spec["volumes"]
    assert not any("valueFrom" in e for e in container["env"])  # a claim needs no Secret
    verdict = read_folder(qwen3_folder, "pvc://models/qwen3").to_message()
    reconciler.reconcile(store.job(), finished(pod, verdict))
    assert conditions(store)["Planned"]["status"] == "True"
    assert store.body["status"]["plan"]["modelBytes"] == 4096 + len((qwen3_folder / "config.json").read_bytes())
    (record,) = [c for c in applied(store, "ConfigMap") if c["metadata"]["name"] == "job-model"]
    assert json.loads(record["data"]["config.json"])["model_type"] == "qwen3"
    assert store.deleted_pods[-1] == [("job-model-inspector", "insp-1")]
    assert applied(store, "StatefulSet")  # and the gang starts
    # a restarted operator (or a re-plan after an OOM) plans with the kept config, reading nothing
    again = Reconciler(store, OPTIONS, ignore_events)
    job = FineTuneJob.from_manifest(store.job())
    known = again.sources.known(job)
    assert known is not None and known.config["model_type"] == "qwen3" and known.origin == "pvc://models/qwen3"
    other = FineTuneJob.from_manifest(stored_job(model={"uri": "pvc://models/other"}))
    assert again.sources.known(other) is None  # another model: the record is stale


def test_an_inspectors_verdict_of_failure_fails_the_job_with_its_reason() -> None:
    store = FakeCluster(stored_job(**CLAIM_JOB))
    reconciler = Reconciler(store, OPTIONS, ignore_events)
    reconciler.reconcile(store.job(), observe(None, []))
    (pod,) = applied(store, "Pod")
    gated = ModelInspection.failed("hub:org/m", MODEL_GATED, "org/m is gated: set spec.hfTokenSecretRef ...")
    reconciler.reconcile(store.job(), finished(pod, gated.to_message()))
    failed = conditions(store)["Failed"]
    assert (failed["reason"], failed["message"]) == (MODEL_GATED, "org/m is gated: set spec.hfTokenSecretRef ...")
    assert store.deleted_pods[-1] == [("job-model-inspector", "insp-1")]


def test_an_inspector_that_crashed_says_what_it_printed() -> None:
    store = FakeCluster(stored_job(**CLAIM_JOB))
    reconciler = Reconciler(store, OPTIONS, ignore_events)
    reconciler.reconcile(store.job(), observe(None, []))
    (pod,) = applied(store, "Pod")
    reconciler.reconcile(store.job(), finished(pod, "Traceback ...\nPermissionError: /mnt/pvc/models", code=1))
    failed = conditions(store)["Failed"]
    assert failed["reason"] == "ModelInspectionFailed" and "PermissionError: /mnt/pvc/models" in failed["message"]


def test_a_hub_id_with_a_token_is_read_by_the_inspector_through_secret_key_ref() -> None:
    store = FakeCluster(stored_job(model={"uri": "hf://org/private@v1"}, hfTokenSecretRef={"name": "hf", "key": "t"}))
    reconciler = Reconciler(store, OPTIONS, ignore_events, hub=HubSettings(endpoint="http://mirror.test"))
    reconciler.reconcile(store.job(), observe(None, []))
    (pod,) = applied(store, "Pod")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "t"}}
    assert env["HF_ENDPOINT"]["value"] == "http://mirror.test"
    args = container["args"]
    assert args[args.index("--hub") + 1] == "org/private" and args[args.index("--revision") + 1] == "v1"


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    config = json.dumps(TINY_QWEN3).encode()
    with HubServer() as server:
        server.add_commit("org/tiny-qwen3", {"config.json": config, "model.safetensors": b"\0" * 2048})
        server.add_commit("org/gated", {"config.json": config, "model.safetensors": b"\0"}, gated=True)
        yield server


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.mark.usefixtures("online")
def test_a_public_hub_model_is_read_by_the_operator_once_per_revision(hub: HubServer) -> None:
    settings = HubSettings(endpoint=hub.endpoint)
    stores = [FakeCluster(stored_job(uid, model={"uri": "org/tiny-qwen3"})) for uid in ("u1", "u2")]
    reconciler = Reconciler(stores[0], OPTIONS, ignore_events, hub=settings)
    reconciler.reconcile(stores[0].job(), observe(None, []))
    assert conditions(stores[0])["Planned"]["status"] == "True" and not applied(stores[0], "Pod")
    assert stores[0].body["status"]["plan"]["modelBytes"] == 2048 + len(json.dumps(TINY_QWEN3))
    reads = len(hub.requests)
    second = Reconciler(stores[1], OPTIONS, ignore_events, hub=settings)
    second.sources = reconciler.sources  # one operator: one cache
    second.reconcile(stores[1].job(), observe(None, []))
    assert conditions(stores[1])["Planned"]["status"] == "True" and len(hub.requests) == reads
    gated = FakeCluster(stored_job(model={"uri": "org/gated"}))
    Reconciler(gated, OPTIONS, ignore_events, hub=settings).reconcile(gated.job(), observe(None, []))
    assert conditions(gated)["Failed"]["reason"] == MODEL_GATED
    assert "set spec.hfTokenSecretRef" in conditions(gated)["Failed"]["message"]


@pytest.mark.usefixtures("online")
def test_a_hub_that_does_not_answer_is_retried_with_backoff_and_the_catalogue_stands_in() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    now = [1000.0]
    store = FakeCluster(stored_job(model={"uri": "org/not-in-the-catalogue"}))
    reconciler = Reconciler(store, OPTIONS, ignore_events, hub=HubSettings(endpoint=endpoint))
    reconciler.sources = ModelSources(OPTIONS, HubSettings(endpoint=endpoint), read_config_map=store.read_config_map,
                                      clock=lambda: now[0])  # fmt: skip
    outcome = reconciler.reconcile(store.job(), observe(None, []))
    planned = conditions(store)["Planned"]
    assert (planned["status"], planned["reason"]) == ("False", "HubUnreachable")
    assert f"{endpoint} is unreachable" in planned["message"] and "retrying in 5 s (try 1)" in planned["message"]
    assert outcome.requeue_after == 5.0 and "Failed" not in conditions(store)
    now[0] += 6
    reconciler.reconcile(store.job(), observe(None, []))
    assert "retrying in 10 s (try 2)" in conditions(store)["Planned"]["message"]
    known = FakeCluster(stored_job(model={"uri": "Qwen/Qwen3-8B"}))
    Reconciler(known, OPTIONS, ignore_events, hub=HubSettings(endpoint=endpoint)).reconcile(
        known.job(), observe(None, [])
    )
    assert conditions(known)["Planned"]["status"] == "True"  # planned from the catalogue meanwhile
