"""The docs site's reference pages are what the code generates, and the site builds with --strict.

The generator reads the API models, the `ftjob` parsers, the metric collectors and values.yaml;
these tests hold the committed pages to a fresh generation and check, on small real models,
parsers and registries, that what is added to a source shows up on its page.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from finetune_operator.api.spec import FineTuneJobSpec
from tools import docs_reference
from tools.docs_reference import cli, crd_fields, metrics
from tools.docs_reference.__main__ import main

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def test_the_committed_reference_pages_are_what_the_code_generates() -> None:
    diffs = docs_reference.stale()
    assert not diffs, "run `python -m tools.docs_reference` and commit docs/reference/:\n" + "\n".join(diffs)
    assert main(["--check"]) == 0


def test_check_names_the_stale_page_with_a_diff(tmp_path: Path) -> None:
    docs_reference.write(tmp_path)
    assert docs_reference.stale(tmp_path) == []
    page = tmp_path / "metrics.md"
    page.write_text(page.read_text().replace("finetune_train_loss", "finetune_train_lost"))
    (diff,) = docs_reference.stale(tmp_path)
    assert f"committed {page}" in diff
    assert "-| `finetune_train_lost`" in diff and "+| `finetune_train_loss`" in diff


class _Inner(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)
    depth: int = Field(3, ge=1, le=8, description="How deep.")


class _Before(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)
    name: str = Field(description="A name.", max_length=20)
    inner: _Inner = Field(default_factory=_Inner, description="Nested settings.")


class _After(_Before):
    warmup_steps: int | None = Field(None, alias="warmupSteps", ge=0, description="Steps of linear warmup.")
    mode: str = Field("fast", pattern="^(fast|slow)$", description="Which way.")


def test_a_field_added_to_a_model_appears_with_type_default_bounds_and_description() -> None:
    before = "\n".join(crd_fields.table(_Before, "spec"))
    after = "\n".join(crd_fields.table(_After, "spec"))
    assert "warmupSteps" not in before
    assert "| `spec.warmupSteps` | integer |  | >= 0 | Steps of linear warmup. |" in after
    assert '| `spec.mode` | string | `"fast"` | pattern `^(fast\\|slow)$` | Which way. |' in after
    assert "| `spec.name` | string | required | length <= 20 | A name. |" in after
    assert "| `spec.inner.depth` | integer | `3` | >= 1; <= 8 | How deep. |" in after


def test_the_real_spec_lists_nested_and_list_fields() -> None:
    paths = {f.path for f in crd_fields.fields(FineTuneJobSpec)}
    assert {"model.uri", "method.lora.r", "resources.gpuMemory", "env[].name"} <= paths


def test_an_option_added_to_a_parser_appears_with_default_choices_and_help() -> None:
    parser = argparse.ArgumentParser(prog="ftjob demo")
    parser.add_argument("file", metavar="FILE", help="a job")
    parser.add_argument("--speed", default="fast", choices=["fast", "slow"], help="how fast (default %(default)s)")
    section = "\n".join(cli.command_section("demo", "a demo command", parser))
    assert "## `ftjob demo`" in section and "usage: ftjob demo [-h] [--speed {fast,slow}] FILE" in section
    assert "| `--speed` `SPEED` | `fast` | `fast`, `slow` | how fast (default fast) |" in section
    assert "| `FILE` |  |  | a job |" in section


def test_the_cli_page_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = cli.page()
    monkeypatch.setenv("FTJOB_WATCH_NAMESPACES", "a,b")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert cli.page() == clean
    assert os.environ["FTJOB_WATCH_NAMESPACES"] == "a,b"  # restored after the parsers are built


def test_a_metric_registered_shows_its_exposed_name_type_labels_and_help() -> None:
    registry = CollectorRegistry()
    Counter("demo_events", "Events seen.", ["kind"], registry=registry)
    Gauge("demo_depth", "Queue depth.", registry=registry)
    assert metrics.registry_series(registry) == [
        metrics.Series("demo_depth", "gauge", (), "Queue depth."),
        metrics.Series("demo_events_total", "counter", ("kind",), "Events seen."),
    ]


def test_the_metrics_page_has_the_trainer_and_the_operator_series() -> None:
    names = {s.name for s in metrics.trainer_series()}
    assert {"finetune_train_loss", "finetune_model_state_bytes", "finetune_model_download_bytes"} <= names
    assert {"finetune_tracking_info", "finetune_gpu_memory_allocated_bytes"} <= names
    assert "finetune_operator_reconcile_total" in {s.name for s in metrics.operator_series()}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_docs_site_builds_with_strict(tmp_path: Path) -> None:
    """Broken links, missing anchors and pages left out of nav fail the build (mkdocs.yml's validation)."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=280,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "finetunejob" / "index.html").exists()
