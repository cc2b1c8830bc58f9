"""A pod's model download: the real client against the hub stand-in, its own time limit, and the
gang starting its ranks only once every pod has the model (issue 24, defect 4)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from finetune_localcluster.hub_server import HubServer
from finetune_localcluster.ports import free_port
from finetune_trainer.pod.download_gate import DownloadTimeout, gang_ready, within_limit

pytestmark = pytest.mark.timeout(120)

PREFETCH = """
import json, sys
from finetune_operator.api.job import FineTuneJob
from finetune_trainer.pod.prefetch import prefetch
manifest = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "j"},
            "spec": {"model": {"uri": sys.argv[1]}, "dataset": {"uri": "/d"}, "output": {"uri": "/o"}}}
class Cfg:
    job = FineTuneJob.from_manifest(manifest)
print(prefetch(Cfg(), node_rank=1))
"""


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        files = {"config.json": b'{"model_type": "qwen3"}', "model.safetensors": b"\1" * 50_000, "README.md": b"x"}
        server.add_commit("org/tiny", files)
        server.add_commit("org/tiny", {**files, "config.json": b'{"model_type": "qwen3", "v": 2}'}, ref="v2")
        yield server


def prefetch_in_a_pod(hub: HubServer, home: Path, uri: str) -> Path:
    """`prefetch` as `ftjob train` runs it in a pod: HF_ENDPOINT and HF_HOME from the rendered env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), FTJOB_PREFETCH_MODEL="1")
    argv = [sys.executable, "-c", PREFETCH, uri]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1])


def test_a_pod_downloads_the_model_once_and_a_restarted_one_downloads_nothing(hub: HubServer, tmp_path: Path) -> None:
    folder = prefetch_in_a_pod(hub, tmp_path / "cache", "org/tiny")
    first = hub.downloaded("org/tiny")
    assert first == 50_000 + len(b'{"model_type": "qwen3"}')  # what a pod loads: not the README
    assert (folder / "model.safetensors").stat().st_size == 50_000
    prefetch_in_a_pod(hub, tmp_path / "cache", "org/tiny")  # the gang restarted: same claim, same files
    assert hub.downloaded("org/tiny") == first
    pinned = prefetch_in_a_pod(hub, tmp_path / "cache", "hf://org/tiny@v2")
    assert json.loads((pinned / "config.json").read_text())["v"] == 2
    assert hub.downloaded("org/tiny") == first + len(b'{"model_type": "qwen3", "v": 2}')  # the weights are shared


def test_no_pod_starts_its_ranks_before_every_pod_has_the_model() -> None:
    port, released = free_port(), {}
    deadline = time.monotonic() + 30

    def pod(rank: int, download_seconds: float) -> None:
        time.sleep(download_seconds)
        gang_ready(rank, 3, "127.0.0.1", port, deadline)
        released[rank] = time.monotonic()

    started = time.monotonic()
    threads = [threading.Thread(target=pod, args=(rank, delay)) for rank, delay in ((0, 0.0), (1, 0.1), (2, 1.0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(released) == [0, 1, 2]
    assert min(released.values()) - started >= 1.0  # the slowest download held everyone back
    with socket.socket() as rendezvous:  # node 0's ranks can bind the port at once (as torch's store does)
        rendezvous.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rendezvous.bind(("", port))


def test_a_pod_that_never_gets_the_model_times_the_others_out_not_the_rendezvous() -> None:
    port = free_port()
    deadline = time.monotonic() + 1.5
    errors: dict[int, str] = {}

    def pod(rank: int) -> None:
        try:
            gang_ready(rank, 3, "127.0.0.1", port, deadline)
        except DownloadTimeout as exc:
            errors[rank] = str(exc)

    threads = [threading.Thread(target=pod, args=(rank,)) for rank in (0, 1)]  # node 2 is still downloading
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert "only 2 of 3 pods finished their download" in errors[0]
    assert "node 1 waited for the other pods' downloads" in errors[1]


def test_a_download_has_its_own_time_limit() -> None:
    with pytest.raises(DownloadTimeout, match=r"downloading org/big took more than 0 s \(FTJOB_DOWNLOAD_TIMEOUT"):
        within_limit(lambda: time.sleep(5), 0.2, "downloading org/big")
    assert within_limit(lambda: "path", 5.0, "downloading org/small") == "path"
    empty: dict[str, str] = {}
    with pytest.raises(KeyError):
        within_limit(lambda: empty["missing"], 5.0, "downloading org/broken")
