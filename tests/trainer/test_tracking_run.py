"""Real runs that publish to a real MLflow server (and TensorBoard files): the entrypoint, two gloo
ranks, the journal and the publishers, as in a pod.

A run killed after its step-4 checkpoint and started again is one MLflow run with every step
once, the params, the adapter and the config as artifacts, and TensorBoard files with the same
scalars. A server that never answers costs the run nothing but the flush wait at the end.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster.mlflow_server import MlflowServer
from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(900)]


def planned(config: Path, per_gpu_bytes: int = 2**30) -> Path:
    """The fixed test plan with a planned footprint, as the planner gives one (memory peak vs plan)."""
    plan = json.loads((config / "plan.json").read_text())
    (config / "plan.json").write_text(json.dumps({**plan, "perGpuBytes": per_gpu_bytes}))
    return config


def tracked_manifest(uri: str, experiment: str, **training: Any) -> dict[str, Any]:
    return job_manifest(
        "builtin://tiny-llama",
        "builtin://reverse-words",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.02},
        training={"maxSteps": 8, "checkpointEverySteps": 2, "evalEverySteps": 4, **training},
        tracking={"mlflow": {"trackingUri": uri, "experiment": experiment}, "tensorboard": {"enabled": True}},
    )


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def artifact_paths(client: Any, run_id: str, path: str | None = None) -> list[str]:
    found: list[str] = []
    for item in client.list_artifacts(run_id, path):
        found += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def test_a_run_killed_after_its_checkpoint_is_one_mlflow_run_with_every_step_once(
    tmp_path: Path, mlflow_server: MlflowServer, launch: Callable[..., Run]
) -> None:
    from mlflow.tracking import MlflowClient

    config = planned(render_config(tmp_path / "config", tracked_manifest(mlflow_server.url, "trainer-resume")))
    out = tmp_path / "out"
    env = {"FTJOB_FAULT_KILL": "step:5"}  # both ranks, once: after step 5, the step-4 checkpoint is the newest
    first = launch(config, out, env=env, tag="first")
    assert first.wait(600) != 0, first.log()[-3000:]
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_experiment_by_name("trainer-resume")
    (failed,) = client.search_runs([experiment.experiment_id])
    assert failed.info.status == "FAILED"
    # what the step-4 checkpoint holds may be published; step 5, which the killed gang took, never
    assert {m.step for m in client.get_metric_history(failed.info.run_id, "loss")} <= {1, 2, 3, 4}

    second = launch(config, out, env=env, tag="second")
    assert second.wait(600) == 0, second.log()[-3000:]
    assert "resumed from" in second.log()
    (run,) = client.search_runs([experiment.experiment_id])
    run_id = run.info.run_id
    assert run_id == failed.info.run_id and run.info.status == "FINISHED"
    tracking = second.summary()["tracking"]
    assert tracking["runId"] == run_id and tracking["runUrl"].endswith(f"/runs/{run_id}")
    assert "unpublishedRecords" not in tracking and tracking["tensorboardLogDir"] == str(out / "tensorboard")

    losses = second.losses()  # the train log's last record of each step: the resumed gang's
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")]
    assert sorted(history) == [(step, losses[step]) for step in range(1, 9)]
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval_loss")) == [0, 4, 8]
    for key in ("learning_rate", "grad_norm", "tokens_per_second", "memory_peak_bytes", "memory_peak_vs_plan"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, 9)), key
    params = run.data.params
    assert (params["lora.r"], params["lora.alpha"], params["method"], params["plan.zero_stage"]) == (
        "8",
        "16",
        "lora",
        "2",
    )
    assert params["global_batch_size"] == "4" and params["learning_rate"] == "0.001"
    assert run.data.tags["ftjob.job"] == "t" and run.data.tags["ftjob.uid"].startswith("local-")
    artifacts = artifact_paths(client, run_id)
    assert {"adapter/adapter_model.safetensors", "config/plan.json", "config/deepspeed.json"} <= set(artifacts)

    board = tensorboard_scalars(out / "tensorboard", "loss")  # float32 in event files
    assert [s for s, _ in board] == list(range(1, 9))
    assert [v for _, v in board] == pytest.approx([v for _, v in sorted(history)], rel=1e-6)
    assert [s for s, _ in tensorboard_scalars(out / "tensorboard", "eval_loss")] == [0, 4, 8]


def test_a_tracking_server_that_never_answers_costs_only_the_flush_wait(
    tmp_path: Path, launch: Callable[..., Run]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manifest = tracked_manifest(f"http://127.0.0.1:{port}", "nowhere", maxSteps=2, evalEverySteps=2)
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out",
                 env={"FTJOB_TRACKING_FLUSH_SECONDS": "3"})  # fmt: skip
    assert run.wait(600) == 0, run.log()[-3000:]
    summary = run.summary()
    assert summary["steps"] == 2 and summary["adapterUri"]
    tracking = summary["tracking"]
    journal = (tmp_path / "out" / "tracking" / "records.jsonl").read_text().splitlines()
    assert len(journal) == 4  # the evaluations before and after, and steps 1 and 2
    assert tracking["unpublishedRecords"] == 4 and tracking["reason"] == "unreachable", tracking
    assert "runId" not in tracking
    assert [s for s, _ in tensorboard_scalars(tmp_path / "out" / "tensorboard", "loss")] == [1, 2]
