"""The traced estimator against the analytical activation term (slow: builds real models)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from finetune_operator.plan.search.activations import activation_bytes
from finetune_operator.plan.sources.model_source import catalogue_entries, catalogue_entry
from finetune_operator.plan.workload import workload_from_spec
from tests.factories import make_job

pytest.importorskip("transformers")
pytest.importorskip("peft")


def cut_to_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """The config with only its first `layers` decoder layers (an image-text model's in `text_config`)."""
    if "text_config" in config:
        return config | {"text_config": cut_to_layers(config["text_config"], layers)}
    cut = config | {"num_hidden_layers": layers}
    if isinstance(config.get("layer_types"), list):
        cut["layer_types"] = config["layer_types"][:layers]
    return cut


@pytest.mark.slow
@pytest.mark.parametrize("arch", catalogue_entries())
@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_analytical_activation_peak_is_within_5_percent_of_the_traced_one(
    arch: str, method: str, checkpointing: bool
) -> None:
    """Every catalogue model, cut to two layers (what differs is per layer, and at two layers the
    terms outside the layers weigh most), default LoRA (all-linear, dropout where allowed)."""
    from finetune_operator.plan.search.traced import trace_training_step

    layers, seq = 2, 512
    spec = make_job(
        model={"uri": "org/model", "architecture": arch},
        method={"type": method},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": seq},
    ).spec
    workload = workload_from_spec(spec)
    workload = dataclasses.replace(workload, shape=dataclasses.replace(workload.shape, num_layers=layers))
    config = cut_to_layers(catalogue_entry(arch).config, layers)
    traced = trace_training_step(
        config,
        1,
        seq,
        lora_r=None if method == "full" else workload.lora_r,
        target_modules=workload.target_modules,
        lora_dropout=workload.lora_dropout,
        gradient_checkpointing=checkpointing,
    )
    analytical = activation_bytes(workload, 1, checkpointing)
    assert analytical.activations + analytical.logits == pytest.approx(traced.activation_peak_bytes, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "dropout", "targets"),
    [
        ("llama-3.1-8b", 0.0, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),  # torchtune's
        ("qwen2.5-7b", 0.1, ["q_proj", "v_proj"]),
        ("phi-3-mini", 0.05, ["all-linear"]),
        ("mixtral-8x7b", 0.1, ["q_proj", "v_proj"]),  # frozen experts, dropout allowed
    ],
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_settings_the_analytical_peak_follows(
    arch: str, dropout: float, targets: list[str], checkpointing: bool
) -> None:
    """Dropout on or off and partial targets change what LoRA keeps: within 5 % at 2 × 1024."""
    from finetune_operator.plan.search.traced import trace_training_step

    layers, seq = 2, 1024
    spec = make_job(
        model={"uri": "org/model", "architecture": arch},
        method={"type": "lora", "lora": {"r": 8, "dropout": dropout, "targetModules": targets}},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": seq},
    ).spec
    workload = workload_from_spec(spec)
    workload = dataclasses.replace(workload, shape=dataclasses.replace(workload.shape, num_layers=layers))
    traced = trace_training_step(
        cut_to_layers(catalogue_entry(arch).config, layers),
        1,
        seq,
        lora_r=8,
        target_modules=targets,
        lora_dropout=dropout,
        gradient_checkpointing=checkpointing,
    )
    analytical = activation_bytes(workload, 1, checkpointing)
    assert analytical.activations + analytical.logits == pytest.approx(traced.activation_peak_bytes, rel=0.05)


def test_the_traced_checked_families_are_the_catalogues() -> None:
    """`TRACED_FAMILIES` (no note in the plan) is exactly what the 5 % test above covers."""
    from finetune_operator.plan.counting.activation_traits import TRACED_FAMILIES

    assert {str(catalogue_entry(entry).config["model_type"]) for entry in catalogue_entries()} == TRACED_FAMILIES


def test_cuda_dropout_keeps_a_boolean_mask() -> None:
    """The trace plans GPUs: its dropout keeps CUDA's one-byte mask, not the CPU's bf16 one."""
    import torch

    from finetune_operator.plan.search.traced import LiveStorageBytes, _dropout_as_on_cuda

    def kept_after_dropout(cuda: bool) -> int:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.1)).to(torch.bfloat16)
        if cuda:
            _dropout_as_on_cuda(model)
        x = torch.ones(32, 64, dtype=torch.bfloat16, requires_grad=True)
        counter = LiveStorageBytes()
        counter.ignore([*model.parameters(), x])
        with counter:
            out = model(x)
            kept = counter.live
        assert out.requires_grad
        return kept

    elements = 32 * 64  # the dropped bf16 copy stays, and the mask dropout's backward needs
    assert kept_after_dropout(cuda=True) == 2 * elements + 1 * elements
    assert kept_after_dropout(cuda=False) == 2 * elements + 2 * elements


@pytest.mark.slow
def test_traced_planning_replaces_the_activation_term() -> None:
    from finetune_operator.plan import plan_job

    spec = make_job(
        model={"uri": "builtin://tiny-llama"}, dataset={"uri": "builtin://reverse-words", "maxSeqLength": 128}
    ).spec
    traced, analytical = plan_job(spec, traced=True), plan_job(spec)
    assert traced.traced and traced.chosen is not None and analytical.chosen is not None
    assert traced.chosen.memory.breakdown["activations"] != analytical.chosen.memory.breakdown["activations"]
