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

from finetune_localcluster.ports import free_port
from finetune_operator.api.pod_env import PodEnv
from finetune_trainer.pod import prefetch as prefetch_module
from finetune_trainer.pod.launch import node_rank_from_env
from finetune_trainer.pod.prefetch import hub_repo, prefetch


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


def _cfg(uri: str, dataset: str = "/data.jsonl") -> Any:
    from finetune_operator.api.job import FineTuneJob
    from tests.support.training_runs import job_manifest

    class Cfg:
        job = FineTuneJob.from_manifest(job_manifest(uri, dataset, "/out"))

    return Cfg()


@pytest.mark.parametrize(
    ("model", "dataset", "user", "offline"),
    [
        ("org/model", "/data.jsonl", None, "1"),  # prefetched: the ranks load it from the cache
        ("org/model", "hf://org/data", None, None),  # the ranks still read a dataset from the hub
        ("pvc://models/llama", "/data.jsonl", None, None),  # nothing prefetched
        ("org/model", "/data.jsonl", "0", "0"),  # the user's own value
    ],
    ids=["prefetched", "hub-dataset", "claim-model", "user-value"],
)
def test_the_ranks_do_not_ask_the_hub_again_after_the_prefetch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: str, dataset: str, user: str | None, offline: str | None
) -> None:
    """After the pod's prefetch every rank (8 per pod) asked the hub for the model's files again."""
    from finetune_trainer.pod import launch

    monkeypatch.setenv(PodEnv.FTJOB_PREFETCH_MODEL, "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # set or not by whoever runs the tests
    if user is not None:
        monkeypatch.setenv("HF_HUB_OFFLINE", user)
    cfg = _cfg(model, dataset)
    prefetched = prefetch(cfg, 1, downloader=lambda repo, **_: str(tmp_path), total=0)
    env = launch._rank_env(tmp_path, False, offline=launch.hub_offline(cfg, prefetched))
    assert env.get("HF_HUB_OFFLINE") == offline


def test_prefetch_downloads_once_when_the_pod_asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    calls: list[tuple[str, Any]] = []

    def fake(repo: str, revision: Any = None, allow_patterns: Any = None) -> str:
        calls.append((repo, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv(PodEnv.FTJOB_PREFETCH_MODEL, raising=False)
    assert prefetch(_cfg("meta-llama/Llama-3.1-8B")) is None and calls == []
    monkeypatch.setenv(PodEnv.FTJOB_PREFETCH_MODEL, "1")
    assert prefetch(_cfg("pvc://models/llama")) is None and calls == []
    assert prefetch(_cfg("meta-llama/Llama-3.1-8B")) == str(tmp_path)
    assert [c[0] for c in calls] == ["meta-llama/Llama-3.1-8B"] and "*.safetensors" in calls[0][1]


def test_the_download_shows_its_progress_on_rank_0s_metrics_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """While `ftjob train` fetches a hub model, the operator's own progress reader sees it."""
    import socket

    from finetune_operator.reconcile.progress import Sample, scrape, to_progress

    port = free_port()
    monkeypatch.setenv(PodEnv.FTJOB_PREFETCH_MODEL, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("FTJOB_METRICS_PORT", str(port))
    monkeypatch.setenv("FTJOB_POD_IP", "127.0.0.1")
    monkeypatch.setattr(prefetch_module, "POLL_SECONDS", 0.05)
    blobs = prefetch_module.repo_cache_folder("org/model") / "blobs"
    seen: list[str | None] = []

    def read() -> str | None:
        import time
        from datetime import UTC, datetime

        time.sleep(0.3)  # a few polls of the cache
        values = scrape(f"http://127.0.0.1:{port}/metrics")
        assert values is not None, "the download progress is not served"
        return to_progress(datetime.now(UTC), Sample(0.0, values), None).summary

    def download(repo: str, revision: Any = None, allow_patterns: Any = None) -> str:
        blobs.mkdir(parents=True)
        for part in range(3):
            with (blobs / f"part{part}.incomplete").open("wb") as blob:
                blob.truncate(2**29)  # 0.5 GiB each, sparse
            seen.append(read())
        return str(blobs.parent)

    assert prefetch(_cfg("org/model"), 0, downloader=download, total=3 * 2**29) == str(blobs.parent)
    assert seen == [
        "downloading model 0.5/1.5 GiB (33%)",
        "downloading model 1.0/1.5 GiB (66%)",
        "downloading model 1.5/1.5 GiB (100%)",
    ]
    with socket.socket() as again:  # the port is free for rank 0's own exporter (which reuses addresses)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_a_download_on_another_node_serves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PodEnv.FTJOB_PREFETCH_MODEL, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    served: list[Any] = []

    def download_progress(*a: Any, **k: Any) -> Any:
        served.append(k["port"])
        return _null_context()

    monkeypatch.setattr(prefetch_module, "download_progress", download_progress)
    prefetch(_cfg("org/model"), 1, downloader=lambda *a, **k: str(tmp_path), total=10)
    assert served == [None]


def _null_context() -> Any:
    from contextlib import nullcontext

    return nullcontext()
