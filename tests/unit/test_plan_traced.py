"""The traced estimator against the analytical activation term (slow: builds real models)."""

from __future__ import annotations

import dataclasses

import pytest

from finetune_operator.plan.activations import activation_bytes
from finetune_operator.plan.model_source import catalogue_entry
from finetune_operator.plan.workload import workload_from_spec
from tests.factories import make_job

pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["tiny-llama", "llama-2-7b", "qwen2.5-7b", "gemma-2-9b"])
@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_traced_activation_peak_matches_analytical(arch: str, method: str, checkpointing: bool) -> None:
    from finetune_operator.plan.traced import trace_training_step

    layers = 2 if arch != "tiny-llama" else 4
    spec = make_job(
        model={"uri": "org/model", "architecture": arch},
        method={"type": method},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": 512},
    ).spec
    workload = workload_from_spec(spec)
    workload = dataclasses.replace(workload, shape=dataclasses.replace(workload.shape, num_layers=layers))
    config = catalogue_entry(arch).config | {"num_hidden_layers": layers}
    traced = trace_training_step(
        config,
        1,
        512,
        lora_r=None if method == "full" else 16,
        lora_dropout=workload.lora_dropout,
        gradient_checkpointing=checkpointing,
    )
    analytical = activation_bytes(workload, 1, checkpointing)
    assert analytical.activations + analytical.logits == pytest.approx(traced.activation_peak_bytes, rel=0.15)


@pytest.mark.slow
def test_traced_planning_replaces_the_activation_term() -> None:
    from finetune_operator.plan import plan_job

    spec = make_job(
        model={"uri": "builtin://tiny-llama"}, dataset={"uri": "builtin://reverse-words", "maxSeqLength": 128}
    ).spec
    traced, analytical = plan_job(spec, traced=True), plan_job(spec)
    assert traced.traced and traced.chosen is not None and analytical.chosen is not None
    assert traced.chosen.memory.breakdown["activations"] != analytical.chosen.memory.breakdown["activations"]
