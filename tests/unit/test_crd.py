"""The generated CRD: identical to the committed files, structural, and faithful."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.api import crdgen
from tests.crd_schema import ApiserverEmulation, openapi_schema
from tests.factories import job_document

EXAMPLES = sorted(Path(__file__).resolve().parents[2].joinpath("examples").glob("*.yaml"))


@pytest.mark.parametrize("relative", [crdgen.CRD_FILE, crdgen.CHART_CRD_FILE])
def test_committed_crd_matches_the_models(repo_root: Path, relative: str) -> None:
    assert (repo_root / relative).read_text() == crdgen.render_crd(), (
        f"{relative} is stale: run `python -m finetune_operator.api.crdgen`"
    )


def test_check_mode_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--root", str(tmp_path)]) == 0
    (tmp_path / crdgen.CRD_FILE).write_text("stale\n")
    assert crdgen.main(["--root", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, sub in node.get("properties", {}).items():
        out += _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _walk(node["additionalProperties"], f"{path}{{}}")
    return out


NODES = _walk(openapi_schema())


OPENAPI_KEYS = {
    "type", "description", "properties", "required", "items", "additionalProperties", "enum", "format", "pattern",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
    "maxProperties", "nullable", "anyOf", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}  # fmt: skip


@pytest.mark.parametrize(("path", "node"), NODES, ids=[p or "<root>" for p, _ in NODES])
def test_schema_is_structural(path: str, node: dict[str, Any]) -> None:
    assert set(node) <= OPENAPI_KEYS, f"{path}: keys the apiserver does not accept: {set(node) - OPENAPI_KEYS}"
    special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    assert "type" in node or special, f"{path}: untyped"
    assert "$ref" not in node and "allOf" not in node and "oneOf" not in node
    for branch in node.get("anyOf", []):
        assert set(branch) <= {"type"} and node.get("x-kubernetes-int-or-string"), f"{path}: anyOf beyond int-or-string"
    assert "default" not in node
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        assert isinstance(node.get(key, True), bool), f"{path}: {key} must be a boolean in OpenAPI v3"


def test_optionals_are_nullable_and_required_are_not() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["model"]["properties"]["architecture"]["nullable"] is True
    assert "nullable" not in spec["model"]["properties"]["uri"]
    # presence-tested fields are pruned instead, so has() means "set"
    assert "nullable" not in spec["deepspeed"]["properties"]["nvmePath"]


def test_conditions_are_a_list_map_keyed_by_type() -> None:
    conditions = openapi_schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_cross_field_rules_are_emitted_as_cel() -> None:
    rules = [r["rule"] for _, node in NODES for r in node.get("x-kubernetes-validations", [])]
    assert any("qlora" in r and "precision" in r for r in rules)
    assert any("offloadParams" in r and "zeroStage == 3" in r for r in rules)
    assert any("nvmePath" in r for r in rules)
    assert sum("oldSelf" in r for r in rules) >= 7  # immutable fields


def test_status_subresource_and_printer_columns() -> None:
    version = crdgen.build_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[:7] == ["Status", "Nodes×GPUs", "ZeRO", "Progress", "Loss", "Accuracy", "Age"]


def test_a_preference_job_shows_its_accuracy_where_sft_shows_the_loss() -> None:
    version = crdgen.build_crd()["spec"]["versions"][0]
    column = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Accuracy")
    assert (column["type"], column.get("format"), column["jsonPath"]) == (
        "number",
        "float",
        ".status.progress.preferenceAccuracy",
    )
    assert "priority" not in column  # shown by a plain `kubectl get ftj`
    progress = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["progress"]["properties"]
    for field in ("preferenceAccuracy", "rewardMargin", "rewardsChosen", "rewardsRejected", "evalPreferenceAccuracy"):
        assert progress[field]["type"] == "number" and progress[field]["nullable"] is True, field


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_agree_between_models_and_schema(example: Path) -> None:
    from finetune_operator.cli.manifests import load_jobs

    emulation = ApiserverEmulation()
    documents = [d for d in yaml.safe_load_all(example.read_text()) if d]
    loaded = load_jobs(str(example))
    for document in documents:
        schema_problems = emulation.problems(document)
        if example.name == "invalid.yaml":
            assert schema_problems, "the invalid example must be rejected by the schema too"
            assert loaded.problems
        else:
            assert schema_problems == [], schema_problems
            assert loaded.problems == []


def _transition_allows(field_path: str, old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Evaluate the spec's transition rule for `field_path` as the apiserver would on an update."""
    import celpy
    from celpy.adapter import json_to_cel

    spec_schema = openapi_schema()["properties"]["spec"]
    (rule,) = [
        r
        for r in spec_schema["x-kubernetes-validations"]
        if r.get("fieldPath") == field_path and "oldSelf" in r["rule"]
    ]
    env = celpy.Environment()
    program = env.program(env.compile(rule["rule"]))
    result = program.evaluate({"self": json_to_cel(new), "oldSelf": json_to_cel(old)})
    return not isinstance(result, Exception) and bool(result)


@pytest.mark.parametrize(
    ("method", "old_nodes", "new_nodes", "deepspeed", "allowed"),
    [
        ("lora", 2, 1, None, True),  # an adapter's checkpoint loads on any world size: the gang rolls and resumes
        ("qlora", None, 4, None, True),
        ("lora", 2, 2, None, True),
        ("lora", 2, 1, {"zeroStage": 0}, True),
        ("full", 2, 1, None, True),  # DeepSpeed shards are converted to a universal checkpoint
        ("full", None, 2, {"zeroStage": 3, "offloadOptimizer": "cpu"}, True),
        ("full", 2, 1, {"zeroStage": "auto"}, True),
        ("full", 2, 1, {"zeroStage": 0}, False),  # ZeRO-0 keeps its optimizer state where no converter reads it
        ("full", 2, 4, {"zeroStage": 3, "offloadOptimizer": "nvme", "nvmePath": "/nvme"}, False),
        ("full", 2, 4, {"zeroStage": 3, "offloadParams": "nvme", "nvmePath": "/nvme"}, False),
        ("full", None, 1, {"zeroStage": 0}, True),  # the default is 1: no change
    ],
)
def test_num_nodes_is_mutable_where_the_checkpoint_converts(
    method: str, old_nodes: int | None, new_nodes: int, deepspeed: dict[str, Any] | None, allowed: bool
) -> None:
    def spec(nodes: int | None) -> dict[str, Any]:
        doc = job_document(method={"type": method})["spec"]
        if nodes is not None:
            doc["resources"] = {"numNodes": nodes}
        if deepspeed is not None:
            doc["deepspeed"] = deepspeed
        return dict(doc)

    assert _transition_allows(".resources.numNodes", spec(old_nodes), spec(new_nodes)) is allowed
