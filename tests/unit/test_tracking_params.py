"""The tracking run's parameters name a preference job's objective, adaptation and loss settings."""

from __future__ import annotations

from pathlib import Path

from finetune_operator.plan import fixed_plan
from finetune_trainer.settings import JobConfig
from finetune_trainer.tracking.params import run_params
from tests.factories import make_job


def config(**spec: object) -> JobConfig:
    job = make_job(**spec)
    return JobConfig(directory=Path("/cfg"), job=job, plan=fixed_plan(job.spec), deepspeed={}, hosts=(("a", 1),))


def test_a_dpo_run_records_its_base_beta_loss_and_reference() -> None:
    params = run_params(
        config(
            method={"type": "dpo", "preference": {"base": "full", "beta": 0.3, "lossType": "ipo"}},
            dataset={"format": "preference"},
        )
    )
    assert params["method"] == "dpo"
    expected = {"base": "full", "beta": "0.3", "loss_type": "ipo", "reference": "frozen-copy"}
    assert {k: params[f"preference.{k}"] for k in expected} == expected
    assert "lora.r" not in params  # full: no adapter


def test_an_orpo_run_on_lora_records_the_adapter_and_no_reference() -> None:
    params = run_params(config(method={"type": "orpo"}, dataset={"format": "preference"}))
    assert (params["method"], params["preference.base"], params["preference.reference"]) == ("orpo", "lora", "none")
    assert "preference.loss_type" not in params and "lora.r" in params


def test_an_sft_run_has_no_preference_parameters() -> None:
    assert not [k for k in run_params(config()) if k.startswith("preference.")]
