"""What `ftjob train` reads from its pod before the ranks start (issue 13, defects 5 and 8).

NODE_RANK comes from the pod-index label, which clusters before Kubernetes 1.28 lack (the
env var is then empty): the pod name's ordinal must stand in, or every pod is node 0.
A hub model is downloaded once per pod, before the ranks (the hub itself is replaced by a
recording function: no network here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finetune_trainer import prefetch as prefetch_module
from finetune_trainer.launch import node_rank_from_env
from finetune_trainer.prefetch import hub_repo, prefetch


@pytest.mark.parametrize(
    ("node_rank", "pod", "expected"),
    [("3", "job-workers-1", 3), ("", "job-workers-2", 2), ("", "llama3-8b-lora-workers-11", 11), ("", "", 0)],
)
def test_node_rank_falls_back_to_the_pod_ordinal(
    monkeypatch: pytest.MonkeyPatch, node_rank: str, pod: str, expected: int
) -> None:
    monkeypatch.setenv("NODE_RANK", node_rank)
    monkeypatch.setenv("FTJOB_POD_NAME", pod)
    assert node_rank_from_env() == expected


@pytest.mark.parametrize(
    ("uri", "repo"),
    [("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"), ("hf://org/m", "org/m"), ("pvc://m/x", None)],
)
def test_only_hub_models_are_fetched(uri: str, repo: str | None) -> None:
    assert hub_repo(uri) == repo


def _cfg(uri: str) -> Any:
    from finetune_operator.api.job import FineTuneJob
    from tests.trainer.conftest import job_manifest

    class Cfg:
        job = FineTuneJob.from_manifest(job_manifest(uri, "/data.jsonl", "/out"))

    return Cfg()


def test_prefetch_downloads_once_when_the_pod_asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    calls: list[tuple[str, Any]] = []

    def fake(repo: str, revision: Any = None, allow_patterns: Any = None) -> str:
        calls.append((repo, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv(prefetch_module.ENV, raising=False)
    assert prefetch(_cfg("meta-llama/Llama-3.1-8B")) is None and calls == []
    monkeypatch.setenv(prefetch_module.ENV, "1")
    assert prefetch(_cfg("pvc://models/llama")) is None and calls == []
    assert prefetch(_cfg("meta-llama/Llama-3.1-8B")) == str(tmp_path)
    assert [c[0] for c in calls] == ["meta-llama/Llama-3.1-8B"] and "*.safetensors" in calls[0][1]
