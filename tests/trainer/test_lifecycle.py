"""The entrypoint's contract with the operator, end to end: summary, marker, idling, failure lines."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.training_runs import Run, job_manifest, render_config, wait_for, write_jsonl

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

ONE_RANK = {"numNodes": 1, "gpusPerNode": 0}


@pytest.mark.timeout(300)
def test_success_writes_summary_then_a_restart_idles_until_sigterm(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        resources=ONE_RANK,
        training={"maxSteps": 2, "globalBatchSize": 2},
    )
    config = render_config(tmp_path / "config", manifest)
    out = tmp_path / "out"
    first = launch(config, out, tag="first")
    assert first.wait(240) == 0, first.log()[-3000:]
    summary = first.summary()
    assert {"finalLoss", "steps", "tokens", "adapterUri", "wallSeconds", "evalLoss"} <= summary.keys()
    assert summary["steps"] == 2 and summary["adapterUri"] == f"file://{(out / 'adapter').resolve()}"
    assert json.loads((out / "COMPLETED.json").read_text()) == summary
    lines_before = len(first.train_log())

    restarted = launch(config, out, tag="restart")
    assert wait_for(lambda: "idling" in restarted.log(), timeout=60), restarted.log()
    time.sleep(1.0)
    assert restarted.proc.poll() is None, "a restarted pod of a finished job must stay up, idle"
    assert len(restarted.train_log()) == lines_before, "it must not train again"
    assert json.loads(restarted.termination()) == summary
    restarted.proc.send_signal(signal.SIGTERM)
    assert restarted.wait(10) == 0


@pytest.mark.timeout(120)
def test_missing_model_is_a_clear_one_line_failure(
    tmp_path: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest("/nonexistent/model", str(reverse_jsonl), "/out", resources=ONE_RANK)
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(100) == 1
    message = run.termination()
    assert message.count("\n") == 1
    assert message.startswith("ModelNotFound: model.uri /nonexistent/model: path /nonexistent/model does not exist")


@pytest.mark.timeout(120)
def test_malformed_line_fails_with_file_and_line(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run]
) -> None:
    good = {"instruction": "Reverse.", "input": "red fox", "output": "fox red"}
    data = write_jsonl(tmp_path / "bad.jsonl", [good, good, '{"instruction": "x", ', good])
    manifest = job_manifest(str(tiny_model_dir), str(data), "/out", resources=ONE_RANK)
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(100) == 1
    assert run.termination().startswith(f"DataError: {data}:3: malformed alpaca record: not valid JSON")


@pytest.mark.timeout(180)
def test_skip_policy_counts_malformed_lines(tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run]) -> None:
    good = {"instruction": "Reverse.", "input": "red fox", "output": "fox red"}
    data = write_jsonl(tmp_path / "bad.jsonl", [good] * 10 + ["nope", {"instruction": "x"}] + [good] * 10)
    manifest = job_manifest(
        str(tiny_model_dir),
        str(data),
        "/out",
        resources=ONE_RANK,
        dataset={"onMalformedLine": "Skip"},
        training={"maxSteps": 1, "globalBatchSize": 2},
    )
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(160) == 0, run.log()[-3000:]
    assert run.summary()["skippedRecords"] == 2


@pytest.mark.timeout(240)
def test_a_separate_validation_file_is_the_eval_set_and_trained_tokens_are_counted(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    from finetune_trainer.data.builtin_datasets import reverse_words_records

    held_out = [{k: r[k] for k in ("instruction", "input", "output")} for r in reverse_words_records(16, seed=99)]
    val_file = tmp_path / "held-out.json"  # a JSON array: another format than the training JSONL
    val_file.write_text(json.dumps(held_out))
    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        resources=ONE_RANK,
        dataset={"validationUri": str(val_file)},
        training={"maxSteps": 2, "globalBatchSize": 2, "warmupSteps": 2},
    )
    del manifest["spec"]["dataset"]["validationSplit"], manifest["spec"]["training"]["warmupRatio"]
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(200) == 0, run.log()[-3000:]
    summary = run.summary()
    assert summary["evalLoss"] is not None and summary["evalLossBefore"] is not None
    assert 0 < summary["trainedTokens"] < summary["tokens"]  # the prompts are not trained on
    lrs = [e["lr"] for e in run.train_log() if "lr" in e]
    assert lrs == pytest.approx([0.0005, 0.001])  # two warmup steps: half, then full learning rate
