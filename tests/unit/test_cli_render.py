"""`ftjob render`: manifests for a good job, a clear message (not a traceback) for a bad model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from finetune_operator.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_render_prints_the_three_children(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLES / "lora-8b-2x8.yaml")]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["ConfigMap", "Service", "StatefulSet"]


def test_unknown_model_is_a_message_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: a}\n"
        "spec:\n  model: {uri: nobody/NoSuchModel}\n  dataset: {uri: /d}\n  output: {uri: /o}\n"
    )
    assert main(["render", str(job)]) == 2
    err = capsys.readouterr().err
    assert "InvalidSpec" in err and "NoSuchModel" in err and "model.architecture" in err
    assert "Traceback" not in err
