"""Object storage with real ranks and a real S3 server: two "pods" (two entrypoints, each with
its own scratch folder) read their model and data from the bucket, save, upload and commit
checkpoints there, are killed in the middle of an upload, and resume from the newest committed
checkpoint; refused keys and a dead endpoint fail with one clear line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from finetune_localcluster.ports import free_port
from finetune_localcluster.s3server import S3Server
from tests.support.s3 import (
    BUCKET,
    checkpoint_folders,
    committed_steps,
    job_storage,
    key_env,
    keys,
    running_s3,
    upload_folder,
)
from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

OUT = "runs/two-pods"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="module")
def inputs(s3: S3Server, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    from finetune_trainer.data.builtin_datasets import reverse_words_records

    data = tmp_path_factory.mktemp("data") / "reverse.jsonl"
    rows = [{k: r[k] for k in ("instruction", "input", "output")} for r in reverse_words_records(200, seed=7)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    client = s3.client()
    upload_folder(client, tiny_model_dir, "models/tiny")
    client.upload_file(str(data), BUCKET, "data/reverse.jsonl")
    return f"s3://{BUCKET}/models/tiny", f"s3://{BUCKET}/data/reverse.jsonl"


def scratch(tmp: Path, name: str) -> Path:
    """A pod's emptyDir with its output staging folder (FTJOB_OUTPUT_DIR) inside."""
    (tmp / name).mkdir(parents=True, exist_ok=True)
    return tmp / name / "output"


def start_pods(launch: Callable[..., Run], config: Path, tmp: Path, env: dict[str, str], tag: str) -> list[Run]:
    port = free_port()
    return [
        launch(
            config,
            scratch(tmp, f"scratch{rank}"),
            port=port,
            tag=f"{tag}-node{rank}",
            env={
                "NODE_RANK": str(rank),
                "FTJOB_POD_IP": f"127.0.0.{rank + 1}",
                "FTJOB_S3_MIRROR": str(tmp / f"cache{rank}"),
                **env,
            },
        )
        for rank in (0, 1)
    ]


@pytest.mark.timeout(600)
def test_two_pods_commit_checkpoints_to_the_bucket_and_resume_after_a_kill_mid_upload(
    tmp_path: Path, s3: S3Server, inputs: tuple[str, str], launch: Callable[..., Run]
) -> None:
    model, data = inputs
    manifest = job_manifest(
        model,
        data,
        f"s3://{BUCKET}/{OUT}",
        training={"maxSteps": 12, "checkpointEverySteps": 4, "checkpointsToKeep": 1},
        objectStorage=job_storage(s3),
        tracking={"tensorboard": {"enabled": True}},
    )
    config = render_config(tmp_path / "config", manifest, hostfile="127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    env = {**key_env(s3), "FTJOB_FAULT_KILL": "upload:8", "FTJOB_FAULT_ONCE_DIR": str(tmp_path)}
    client = s3.client()

    killed = start_pods(launch, config, tmp_path, env, "first")
    for node in killed:
        assert node.wait(300) != 0, node.log()[-2000:]
    # step 8 was being uploaded: its folder has no manifest, so it does not exist; step 4 is intact
    assert committed_steps(client, OUT) == [4]
    assert checkpoint_folders(client, OUT) == {"step-00000004", "step-00000008"}
    # the tracking journal and TensorBoard's event files went with the committed checkpoint
    at_commit = set(keys(client, OUT))
    assert "tracking/records.jsonl" in at_commit, sorted(at_commit)
    assert any(key.startswith("tensorboard/events.out.tfevents") for key in at_commit), sorted(at_commit)

    resumed = start_pods(launch, config, tmp_path, env, "second")
    for rank, node in enumerate(resumed):
        assert node.wait(300) == 0, f"node {rank}:\n{node.log()[-3000:]}"
    summary = resumed[0].summary()
    assert summary["resumedFromStep"] == 4 and summary["steps"] == 12
    assert summary["adapterUri"] == f"s3://{BUCKET}/{OUT}/adapter"
    # each pod downloaded the trainable state, the trainer state and its own rank's RNG file only
    for rank, node in enumerate(resumed):
        assert f"downloaded 3 of 4 files of s3://{BUCKET}/{OUT}/checkpoints/step-00000004 for ranks {rank}-{rank}" in (
            node.log()
        ), node.log()[-3000:]
    # checkpointsToKeep: 1 applies to the bucket; the uncommitted step 8 was replaced by a committed one
    assert committed_steps(client, OUT) == [8]
    assert checkpoint_folders(client, OUT) == {"step-00000008"}
    written = keys(client, OUT)
    assert {"adapter/adapter_model.safetensors", "COMPLETED.json", "train_log.jsonl"} <= set(written)
    assert "tracking/records.jsonl" in written and any(key.startswith("tensorboard/") for key in written)
    assert set(keys(client, "models/tiny")) and set(keys(client, "data"))  # inputs untouched
    for node in killed + resumed:
        assert s3.secret_key not in node.log() and s3.secret_key not in node.termination()


@pytest.mark.timeout(180)
def test_refused_keys_and_a_dead_endpoint_fail_with_one_clear_line(
    tmp_path: Path, s3: S3Server, inputs: tuple[str, str], launch: Callable[..., Run]
) -> None:
    model, data = inputs
    manifest = job_manifest(
        model, data, f"s3://{BUCKET}/runs/refused", resources={"numNodes": 1}, objectStorage=job_storage(s3)
    )
    config = render_config(tmp_path / "config", manifest)
    wrong = "not-the-secret-" + s3.secret_key[:6]
    refused = launch(
        config,
        scratch(tmp_path, "a"),
        tag="refused",
        env={**key_env(s3), "AWS_SECRET_ACCESS_KEY": wrong, "FTJOB_S3_MIRROR": str(tmp_path / "a-cache")},
    )
    assert refused.wait(120) == 1
    line = refused.termination()
    assert line.startswith("StorageAccessDenied: ") and "Secret 's3-keys'" in line and s3.endpoint in line, line
    assert wrong not in refused.log() + line

    dead_port = free_port()
    manifest["spec"]["objectStorage"]["endpoint"] = f"http://127.0.0.1:{dead_port}"
    config = render_config(tmp_path / "config-dead", manifest)
    dead = launch(
        config,
        scratch(tmp_path, "b"),
        tag="dead",
        env={**key_env(s3), "FTJOB_S3_RETRY_SECONDS": "3", "FTJOB_S3_MIRROR": str(tmp_path / "b-cache")},
    )
    assert dead.wait(120) == 1
    line = dead.termination()
    assert line.startswith("DataUnavailable: ") and f"http://127.0.0.1:{dead_port} unreachable" in line, line
    assert s3.secret_key not in dead.log() + line
