"""A built-in task's evaluation scores greedy answers to its held-out prompts (SFT: against the
answer), through the real entrypoint with two gloo ranks: every evaluation carries `exact_match`
and its examples, and the summary the operator reads carries the before and after."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_an_sft_evaluation_scores_the_greedy_answers(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(
        str(tiny_model_dir),
        "builtin://secret-code",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 48, "validationSplit": 0.01},
        training={"maxSteps": 2, "evalEverySteps": 2},
    )
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(480) == 0, run.log()[-4000:]
    evals = [e["eval"] for e in run.train_log() if "eval" in e]
    assert len(evals) >= 2, evals  # before the first step, and after the last
    for evaluation in evals:
        assert 0.0 <= evaluation["exact_match"] <= 1.0, evaluation
        assert evaluation["examples"] and all(e["expected"].strip() for e in evaluation["examples"]), evaluation
        assert all(isinstance(e["got"], str) for e in evaluation["examples"]), evaluation
    summary = run.summary()
    assert (summary["exactMatchBefore"], summary["exactMatch"]) == (evals[0]["exact_match"], evals[-1]["exact_match"])
