"""The pod entrypoint's failures before any rank starts: each ends the pod with one line whose
first word is the reason the operator acts on (a bad config, a node outside the hostfile, a
model that cannot be downloaded, a download that outlived its limit). Each runs `train` in its
own interpreter, as a pod does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from finetune_localcluster.hub_server import HubServer
from finetune_localcluster.ports import free_port
from tests.support.training_runs import job_manifest, render_config

pytestmark = pytest.mark.timeout(120)

TRAIN = """
import sys
from finetune_trainer.pod import launch
launch.GANG_SLACK_SECONDS = float(sys.argv[2])
result = launch.train(sys.argv[1], idle_when_done=False)
print(result.exit_code)
"""


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        yield server


def train(config: Path, tmp_path: Path, slack: float = 60.0, **env: str) -> tuple[int, str]:
    """The exit code and the termination message of `train(config)` in a fresh interpreter."""
    log = tmp_path / "termination-log"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("FTJOB_", "HF_", "NODE_RANK", "MASTER_"))}
    full.update(FTJOB_TERMINATION_LOG=str(log), FTJOB_METRICS_PORT="off", HF_HOME=str(tmp_path / "hf"), **env)
    argv = [sys.executable, "-c", TRAIN, str(config), str(slack)]
    done = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=90, check=False)
    assert done.stdout.strip(), done.stderr[-2000:]
    return int(done.stdout.split()[-1]), log.read_text()


def config(tmp_path: Path, hostfile: str | None = None, **spec: object) -> Path:
    manifest = job_manifest("builtin://tiny-llama", "/data/train.jsonl", "/out", resources={"numNodes": 1}, **spec)
    return render_config(tmp_path / "config", manifest, hostfile)


def test_a_missing_config_is_a_config_error(tmp_path: Path) -> None:
    code, line = train(tmp_path / "nowhere", tmp_path, FTJOB_OUTPUT_DIR=str(tmp_path / "out"))
    assert (code, line) == (1, f"ConfigError: {tmp_path}/nowhere/job.json: cannot read (No such file or directory)\n")


def test_an_unreadable_hostfile_is_a_config_error(tmp_path: Path) -> None:
    directory = config(tmp_path, hostfile="localhost slots=two\n")
    code, line = train(directory, tmp_path, FTJOB_OUTPUT_DIR=str(tmp_path / "out"))
    assert (code, line) == (1, "ConfigError: invalid literal for int() with base 10: 'two'\n")


def test_an_output_on_object_storage_without_a_staging_folder_is_a_config_error(tmp_path: Path) -> None:
    storage = {"endpoint": "http://127.0.0.1:9", "credentials": {"secretName": "keys"}}
    directory = config(tmp_path, output={"uri": "s3://bucket/runs/x"}, objectStorage=storage)
    code, line = train(directory, tmp_path)
    assert code == 1
    assert line == (
        "ConfigError: output.uri 's3://bucket/runs/x' is on object storage: FTJOB_OUTPUT_DIR must name a "
        "local staging folder\n"
    )


def test_a_node_outside_the_hostfile_is_a_config_error(tmp_path: Path) -> None:
    code, line = train(config(tmp_path), tmp_path, FTJOB_OUTPUT_DIR=str(tmp_path / "out"), NODE_RANK="3")
    assert (code, line) == (1, "ConfigError: NODE_RANK=3 but the hostfile lists 1 nodes\n")


def test_a_model_the_hub_does_not_have_is_model_not_found(tmp_path: Path, hub: HubServer) -> None:
    directory = config(tmp_path)
    job = json.loads((directory / "job.json").read_text())
    job["spec"]["model"]["uri"] = "org/missing"
    (directory / "job.json").write_text(json.dumps(job))
    code, line = train(
        directory,
        tmp_path,
        FTJOB_OUTPUT_DIR=str(tmp_path / "out"),
        FTJOB_PREFETCH_MODEL="1",
        HF_ENDPOINT=hub.endpoint,
    )
    assert code == 1
    assert line.startswith("ModelNotFound: downloading org/missing: ") and line.count("\n") == 1, line


def test_a_gang_download_wait_past_its_limit_is_a_download_timeout(tmp_path: Path) -> None:
    directory = config(tmp_path, hostfile="127.0.0.1 slots=1\n127.0.0.1 slots=1\n")
    code, line = train(
        directory,
        tmp_path,
        slack=0.0,
        FTJOB_OUTPUT_DIR=str(tmp_path / "out"),
        FTJOB_PREFETCH_MODEL="1",
        FTJOB_DOWNLOAD_TIMEOUT_SECONDS="1",
        NODE_RANK="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),  # no node 0 answers there
    )
    assert code == 1
    assert line.startswith("DownloadTimeout: ") and "FTJOB_DOWNLOAD_TIMEOUT_SECONDS" in line, line
