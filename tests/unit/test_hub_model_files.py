"""Reading a hub model's config.json and file sizes with the real huggingface_hub client.

The client talks to the local hub stand-in (`finetune_localcluster.hub_server`), which answers
as the hub does: resolve with ETag / X-Repo-Commit / X-Linked-Size, LFS files through a signed
redirect to another origin, 401/403 `GatedRepo`, 401/404 `RepoNotFound`, `RevisionNotFound`, an
unknown token refused. Every outcome is a verdict with the reason the operator turns into a
condition and a message naming the field to fix.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster.hub_server import HubServer
from finetune_operator.api.model_inspection import ModelInspection
from finetune_operator.api.model_uri import HubModel, claim_model, hub_model
from finetune_operator.api.reasons import (
    HUB_UNREACHABLE,
    MODEL_ACCESS_DENIED,
    MODEL_GATED,
    MODEL_NOT_FOUND,
    NOT_CAUSAL_LM,
    UNKNOWN_MODEL_TYPE,
)
from finetune_operator.plan.sources.model_files import read_folder, read_hub

pytestmark = pytest.mark.timeout(60)

CONFIG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2}
WEIGHTS = b"\0" * 3000
FILES = {"config.json": json.dumps(CONFIG).encode(), "model.safetensors": WEIGHTS, "tokenizer.json": b"{}",
         "README.md": b"# a model"}  # fmt: skip
DOWNLOADED = len(FILES["config.json"]) + len(WEIGHTS) + len(FILES["tokenizer.json"])


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer(tokens={"hf_alice": "alice", "hf_bob": "bob"}) as server:
        server.add_commit("org/open", FILES)
        server.add_commit("org/open", {**FILES, "config.json": json.dumps({**CONFIG, "hidden_size": 128}).encode()},
                          ref="v2")  # fmt: skip
        server.add_commit("org/gated", FILES, gated=True, users={"alice"})
        server.add_commit("org/bins", {"config.json": FILES["config.json"], "pytorch_model.bin": WEIGHTS})
        encoder = {"model_type": "bert", "architectures": ["BertForMaskedLM"]}
        server.add_commit("org/encoder", {"config.json": json.dumps(encoder).encode(), "model.safetensors": WEIGHTS})
        yield server


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test environment sets HF_HUB_OFFLINE=1 (nothing may reach the real hub): let the client talk."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def read(hub: HubServer, repo: str, revision: str | None = None, token: str | None = None) -> ModelInspection:
    return read_hub(HubModel(repo, revision), endpoint=hub.endpoint, token=token)


def test_a_public_model_gives_its_config_the_bytes_a_pod_downloads_and_the_commit(hub: HubServer) -> None:
    found = read(hub, "org/open")
    assert found.failure is None and found.config == CONFIG
    assert found.weight_bytes == DOWNLOADED  # not the README: a pod downloads configs, weights, tokenizer
    assert found.commit == hub.repos["org/open"].refs["main"] and found.origin == f"hub:org/open@{found.commit}"
    assert hub.downloaded("org/open") == len(FILES["config.json"])  # never the weights
    pinned = read(hub, "org/open", revision="v2")
    assert pinned.config is not None and pinned.config["hidden_size"] == 128
    by_commit = read(hub, "org/open", revision=pinned.commit)
    assert by_commit.config == pinned.config


def test_a_gated_model_without_a_token_names_hf_token_secret_ref(hub: HubServer) -> None:
    found = read(hub, "org/gated")
    assert found.failure == MODEL_GATED
    assert found.message is not None and "org/gated" in found.message and "set spec.hfTokenSecretRef" in found.message


def test_a_gated_model_reads_with_a_granted_token_and_refuses_another_account(hub: HubServer) -> None:
    assert read(hub, "org/gated", token="hf_alice").config == CONFIG
    refused = read(hub, "org/gated", token="hf_bob")
    assert refused.failure == MODEL_ACCESS_DENIED and "not on its access list" in str(refused.message)
    unknown = read(hub, "org/gated", token="hf_forged")
    assert unknown.failure == MODEL_ACCESS_DENIED and "Invalid credentials" in str(unknown.message)


@pytest.mark.parametrize(
    ("repo", "revision", "words"),
    [
        ("org/missing", None, "does not exist or is private (then set spec.hfTokenSecretRef)"),
        ("org/open", "no-such-branch", "has no revision 'no-such-branch'"),
        ("org/bins", None, "no *.safetensors weights"),
    ],
)
def test_what_is_not_there_is_model_not_found_naming_it(hub: HubServer, repo: str, revision: str | None,
                                                        words: str) -> None:  # fmt: skip
    found = read(hub, repo, revision)
    assert found.failure == MODEL_NOT_FOUND and words in str(found.message), found


def test_an_encoder_is_not_a_causal_lm(hub: HubServer) -> None:
    found = read(hub, "org/encoder")
    assert found.failure == NOT_CAUSAL_LM and "BertForMaskedLM" in str(found.message)


def test_an_endpoint_that_does_not_answer_is_unreachable_not_missing() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    found = read_hub(HubModel("org/open"), endpoint=endpoint, token=None)
    assert found.failure == HUB_UNREACHABLE and endpoint in str(found.message)


def test_a_claim_folder_is_read_like_the_hub(tmp_path: Path) -> None:
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content)
    found = read_folder(tmp_path, "pvc://models/qwen3")
    assert found.config == CONFIG and found.weight_bytes == DOWNLOADED and found.origin == "pvc://models/qwen3"
    assert read_folder(tmp_path / "nope", "pvc://models/nope").failure == MODEL_NOT_FOUND
    (tmp_path / "model.safetensors").unlink()
    assert "no *.safetensors" in str(read_folder(tmp_path, "pvc://models/qwen3").message)


def test_the_verdict_fits_a_termination_message_and_round_trips() -> None:
    big: dict[str, Any] = {**CONFIG, "layer_types": ["full_attention"] * 200, "id2label": {str(i): f"L{i}" for i in
                                                                                         range(3000)}}  # fmt: skip
    found = ModelInspection(origin="pvc://m/x", config=big, weight_bytes=1, commit=None)
    message = found.to_message()
    assert len(message.encode()) <= 4096
    back = ModelInspection.from_message(message)
    assert back is not None and back.config is not None and back.config["layer_types"] == big["layer_types"]
    assert "id2label" not in back.config  # dropped to fit: the planner never reads it
    assert ModelInspection.from_message("Traceback (most recent call last): ...") is None


def test_model_uris_name_the_same_repo_and_revision_everywhere() -> None:
    assert hub_model("hf://Qwen/Qwen3-8B@v1") == HubModel("Qwen/Qwen3-8B", "v1")
    assert hub_model("Qwen/Qwen3-8B", "main") == HubModel("Qwen/Qwen3-8B", "main")
    assert hub_model("pvc://models/qwen3") is None and claim_model("pvc://models/a/b/") == claim_model(
        "pvc://models/a/b"
    )
    assert str(claim_model("pvc://models")) == "pvc://models"


def test_the_inspector_command_checks_the_images_transformers(tmp_path: Path, hub: HubServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`ftjob inspect-model` writes the verdict where the kubelet reads it, with the token from HF_TOKEN."""
    from finetune_operator.cli.main import main

    out = tmp_path / "termination-log"
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_alice")
    assert main(["inspect-model", "--hub", "org/gated", "--output", str(out)]) == 0
    verdict = ModelInspection.from_message(out.read_text())
    assert verdict is not None and verdict.config == CONFIG
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONFIG, "model_type": "qwen99"}))
    (folder / "model.safetensors").write_bytes(WEIGHTS)
    assert main(["inspect-model", "--folder", str(folder), "--origin", "pvc://m/q", "--output", str(out)]) == 0
    verdict = ModelInspection.from_message(out.read_text())
    assert verdict is not None and verdict.failure == UNKNOWN_MODEL_TYPE
    assert "'qwen99' is unknown to transformers" in str(verdict.message)
