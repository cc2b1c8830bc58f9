"""validate reads a manifest as the apiserver stores it: nulls pruned, integral floats as
integers, Go's `0o` integers, and label/annotation rules (the robustness tier checks the same
against the real apiserver on 1,000 documents)."""

from __future__ import annotations

from pathlib import Path

from finetune_operator.cli.apiserver_view import as_stored, metadata_problems
from finetune_operator.cli.manifests import load_jobs, parse_yaml_documents

HEAD = """apiVersion: finetune.dev/v1alpha1
kind: FineTuneJob
metadata: {name: job}
spec:
  model: {uri: org/model}
  dataset: {uri: pvc://data/train.jsonl}
  output: {uri: pvc://out/job}
"""


def _validate(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    loaded = load_jobs(str(path))
    assert loaded.problems or len(loaded.jobs) == 1
    return loaded.problems


def test_go_octal_integers_read_as_kubectl_reads_them() -> None:
    assert parse_yaml_documents("a: 0o17\nb: 017\nc: 0x10\nd: 2e-4\n") == [{"a": 15, "b": 15, "c": 16, "d": 2e-4}]


def test_an_integral_float_in_an_integer_field_is_the_integer(tmp_path: Path) -> None:
    assert _validate(tmp_path, HEAD + "  training: {maxSteps: 42.0}\n  resources: {numNodes: 2.0}\n") == []
    problems = _validate(tmp_path, HEAD + "  training: {maxSteps: 42.5}\n")
    assert problems and "spec.training.maxSteps" in problems[0]


def test_a_null_in_a_field_that_is_not_nullable_takes_the_default(tmp_path: Path) -> None:
    assert _validate(tmp_path, HEAD + "  training: null\n  method: {type: lora, lora: {r: 8, alpha: null}}\n") == []
    stored = as_stored({"spec": {"training": None, "method": {"lora": {"alpha": None}}}})
    assert stored == {"spec": {"method": {"lora": {}}}}


def test_a_null_in_a_nullable_field_is_kept() -> None:
    assert as_stored({"spec": {"model": {"architecture": None}}}) == {"spec": {"model": {"architecture": None}}}
    # validationSplit's presence is tested by a rule (has()), so it is not nullable: pruned
    assert as_stored({"spec": {"dataset": {"validationSplit": None}}}) == {"spec": {"dataset": {}}}


def test_label_and_annotation_rules_name_the_key(tmp_path: Path) -> None:
    text = HEAD.replace("metadata: {name: job}", "metadata: {name: job, labels: {team: 'bad value!'}}")
    problems = _validate(tmp_path, text)
    assert problems == [f"{tmp_path / 'job.yaml'}[0] (job): " + metadata_problems(
        {"metadata": {"labels": {"team": "bad value!"}}})[0]]  # fmt: skip
    assert "metadata.labels['team']: invalid value 'bad value!'" in problems[0]
    assert metadata_problems({"metadata": {"labels": {"a" * 64: "x"}}})[0].startswith("metadata.labels['aaaa")
    assert metadata_problems({"metadata": {"annotations": {"k": "v" * 300_000}}})[-1].startswith(
        "metadata.annotations: 300,001 bytes"
    )
    assert (
        metadata_problems({"metadata": {"labels": {"example.com/team": "ml-1.2_x"}, "annotations": {"a": "b"}}}) == []
    )
