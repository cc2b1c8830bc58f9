"""Two "nodes": two entrypoints (node ranks 0 and 1, --no_ssh) on two 127.x addresses, one hostfile.

Node 0's launcher forks its rank (a CPU node's default); node 1's starts it as a fresh
interpreter (a GPU node's way): the two ways of starting a rank train together.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from finetune_localcluster.ports import free_port
from finetune_trainer.pod.node_launcher import CPU_PRELOAD, PRELOAD_ENV
from tests.support.training_runs import Run, job_manifest, render_config, wait_for

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_two_launchers_train_together(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        resources={"numNodes": 2, "gpusPerNode": 0},
        training={"maxSteps": 30, "globalBatchSize": 4},
    )
    config = render_config(tmp_path / "config", manifest, hostfile="127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    out = tmp_path / "out"  # the shared output volume
    port = free_port()
    metrics = {0: free_port(), 1: free_port()}
    nodes = [
        launch(
            config,
            out,
            port=port,
            tag=f"node{rank}",
            env={
                "NODE_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "FTJOB_POD_IP": f"127.0.0.{rank + 1}",
                "FTJOB_METRICS_PORT": str(metrics[rank]),
                PRELOAD_ENV: "none" if rank == 1 else ",".join(CPU_PRELOAD),
            },
        )
        for rank in (0, 1)
    ]

    def scrape(rank: int) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.{rank + 1}:{metrics[rank]}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    # node 1's rank serves its own metrics on its own address while training
    scraped = {"text": ""}

    def training_on_node1() -> bool:
        scraped["text"] = scrape(1) or scraped["text"]
        return "finetune_train_max_steps 30.0" in scraped["text"] or nodes[1].proc.poll() is not None

    assert wait_for(training_on_node1, 200)
    text = scraped["text"]
    for rank, node in enumerate(nodes):
        assert node.wait(240) == 0, f"node {rank}:\n{node.log()[-3000:]}"
    assert 'rank="1"' in text and "finetune_train_tokens_total" in text and "finetune_train_max_steps 30.0" in text
    summaries = [node.summary() for node in nodes]
    assert summaries[0]["steps"] == summaries[1]["steps"] == 30
    assert summaries[0]["finalLoss"] == pytest.approx(summaries[1]["finalLoss"])  # all-reduced: same on every node
    assert "x world 2" in nodes[0].log()
    assert (out / "COMPLETED.json").exists()
