"""Where the planner finds a model's architecture, and the errors when it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_operator.plan import DoesNotFitError, ModelConfigNotFoundError, UnknownArchitectureError, plan_job
from finetune_operator.plan.errors import PlanningError
from finetune_operator.plan.sources.model_source import resolve_model, resolve_reference
from tests.factories import make_job


@pytest.mark.parametrize(
    ("reference", "entry"),
    [
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("hf://meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("QWEN/qwen2.5-72b", "qwen2.5-72b"),
        ("builtin://tiny-llama", "tiny-llama"),
        ("mixtral-8x7b", "mixtral-8x7b"),
    ],
)
def test_catalogue_names_and_aliases_resolve(reference: str, entry: str) -> None:
    assert resolve_reference(reference).name == entry


def test_every_catalogue_name_and_hub_id_resolves_to_its_entry() -> None:
    from finetune_operator.api.catalogue import read_entry
    from finetune_operator.plan.sources.model_source import catalogue_entries

    for entry in catalogue_entries():
        for reference in (entry, *read_entry(entry, private=True)["_names"]):
            assert resolve_reference(reference).name == entry, reference
            assert resolve_reference(f"hf://{reference}").name == entry, reference


@pytest.mark.parametrize(
    ("reference", "entry"),
    [
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("meta-llama/Llama-3.2-3B", "llama-3.2-3b"),
        ("google/gemma-3-12b-pt", "gemma-3-12b"),
        ("microsoft/phi-4", "phi-4"),
        ("allenai/OLMo-2-1124-7B", "olmo-2-7b"),
        ("ibm-granite/granite-3.3-8b-instruct", "granite-3.3-8b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
    ],
)
def test_the_models_users_name_today_resolve_offline(reference: str, entry: str) -> None:
    """The issue's list: each hub id plans from the catalogue without a network."""
    source = resolve_reference(reference)
    assert source.name == entry and source.origin == f"catalogue:{entry}"


def test_tiny_llama_architecture_fields_are_untouched() -> None:
    config = resolve_reference("builtin://tiny-llama").config
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (256, 4, 512)


def test_local_directory_with_config_json(tmp_path: Path) -> None:
    config = resolve_reference("llama-2-7b").config | {"num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = plan_job(make_job(model={"uri": str(tmp_path)}).spec)
    assert result.workload.shape.num_layers == 2 and result.chosen is not None


def test_the_operator_never_reads_an_absolute_model_path_on_its_own_filesystem(tmp_path: Path) -> None:
    from finetune_operator.reconcile.decision import PlanFailed
    from finetune_operator.reconcile.runner import plan_or_fail

    config = resolve_reference("llama-2-7b").config | {"num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))  # there, but on the operator's disk
    for uri in (str(tmp_path), f"file://{tmp_path}"):
        with pytest.raises(PlanFailed) as failed:
            plan_or_fail(make_job(model={"uri": uri}).spec)
        assert failed.value.reason == "InvalidSpec", failed.value
        assert "spec.model.uri" in str(failed.value) and "set spec.model.architecture" in str(failed.value)
    # Naming the architecture plans it, from the catalogue, as the pods will load it.
    plan = plan_or_fail(make_job(model={"uri": str(tmp_path), "architecture": "llama-2-7b"}).spec)
    assert plan.zero_stage in (0, 1, 2, 3)


def test_missing_config_json_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigNotFoundError, match=r"config\.json does not exist.*model\.architecture"):
        plan_job(make_job(model={"uri": str(tmp_path)}).spec)


def test_unknown_hub_model_lists_the_catalogue() -> None:
    with pytest.raises(
        UnknownArchitectureError, match=r"^spec\.model\.uri: .*not in the planner's catalogue \(.*llama-2-7b"
    ):
        plan_job(make_job(model={"uri": "someone/unknown-model"}).spec)


def test_an_unknown_architecture_names_the_architecture_field_and_the_operator_offers_no_local_path() -> None:
    model = make_job(model={"uri": "someone/unknown-model", "architecture": "UPPER"}).spec.model
    with pytest.raises(UnknownArchitectureError, match=r"^spec\.model\.architecture: 'UPPER' is not") as caught:
        resolve_model(model, local_files=False)
    assert "path" not in str(caught.value).split(";")[-1]
    with pytest.raises(UnknownArchitectureError, match=r"or to an absolute path with config\.json"):
        resolve_model(model)


def test_pvc_model_without_architecture_explains_the_fix() -> None:
    with pytest.raises(UnknownArchitectureError, match="cannot read pvc:// volumes"):
        plan_job(make_job(model={"uri": "pvc://models/llama"}).spec)


def test_unsupported_family(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(UnknownArchitectureError, match="'bert' is not a family the planner can count"):
        plan_job(make_job(model={"uri": str(tmp_path)}).spec)


def test_errors_carry_the_condition_reason() -> None:
    assert UnknownArchitectureError.condition_reason == "InvalidSpec"
    assert DoesNotFitError.condition_reason == "DoesNotFit"
    assert issubclass(DoesNotFitError, PlanningError)


@pytest.mark.parametrize("bad", ["abc", -4, 2.5, True, None, 10**50])
def test_a_config_json_of_odd_values_is_invalid_spec_not_a_crash(tmp_path: Path, bad: object) -> None:
    config = resolve_reference("llama-2-7b").config | {"hidden_size": bad}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlanningError) as failed:
        plan_job(make_job(model={"uri": str(tmp_path)}).spec)
    assert failed.value.condition_reason == "InvalidSpec" and "hidden_size" in str(failed.value), failed.value
