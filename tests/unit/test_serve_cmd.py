"""`ftjob serve` and the serving lines of `ftjob describe`, as pure functions of the flags and the job."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from finetune_operator.api import FineTuneJob
from finetune_operator.cli import describe_cmd, serve_cmd
from tests.factories import job_document


def job_with(status: dict[str, Any], **spec: Any) -> FineTuneJob:
    doc = job_document(**spec)
    doc["metadata"] = {"name": "chat", "namespace": "ml"}
    doc["status"] = status
    return FineTuneJob.from_manifest(doc)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ftjob serve")
    serve_cmd.configure(parser)
    return parser.parse_args(argv)


def test_the_flags_set_only_the_serving_fields_given() -> None:
    args = parse("chat", "--target", "Deployment", "--max-lora-rank", "64")
    assert (args.job, args.target) == ("chat", "Deployment")
    assert serve_cmd.settings(args) == {"maxLoraRank": 64}
    both = parse("chat", "--model", "merged", "--base-model-uri", "hf://o/m")
    assert serve_cmd.settings(both) == {"model": "merged", "baseModelUri": "hf://o/m"}


def test_an_unknown_target_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("chat", "--target", "Knative")
    assert exit_.value.code == 2 and "invalid choice: 'Knative'" in capsys.readouterr().err


def test_describe_names_what_serves_the_result_or_why_nothing_does() -> None:
    condition = {"type": "Serving", "status": "True", "reason": "ServingApplied", "message": "",
                 "lastTransitionTime": "2026-12-05T10:00:00Z"}  # fmt: skip
    served = {
        "objects": [{"kind": "InferenceService", "name": "chat"}],
        "served": "adapter",
        "modelName": "chat",
        "url": "http://chat-predictor.ml.svc.cluster.local/openai/v1",
    }
    status = {"state": "Succeeded", "conditions": [condition], "serving": served}
    text = describe_cmd.describe(job_with(status, serving={"target": "InferenceService"}), [], None)
    assert "Serving:     InferenceService\n  InferenceService/chat: the adapter as 'chat'\n" in text
    assert "  url         http://chat-predictor.ml.svc.cluster.local/openai/v1\n" in text
    refused = {**condition, "status": "False", "reason": "ServingRefused", "message": "spec.serving.baseModelUri: x"}
    text = describe_cmd.describe(
        job_with({"state": "Succeeded", "conditions": [refused]}, serving={"target": "Deployment"}), [], None
    )
    assert "  ServingRefused: spec.serving.baseModelUri: x\n" in text
    assert "Serving:" not in describe_cmd.describe(job_with({"state": "Succeeded", "conditions": []}), [], None)
