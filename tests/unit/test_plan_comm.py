"""The communication model (`plan.comm.bytes_per_step`), term by term.

The trainer tier checks it against real DeepSpeed ranks (tests/trainer/test_metrics_comm_bytes.py);
these pin its shape: what scales with micro-steps, what happens once per optimizer step.
"""

from __future__ import annotations

import pytest

from finetune_operator.plan.search.comm import bytes_per_step

GRAD = 2
TRAINABLE = 1_000_000
PARAMS = 8e9  # bytes gathered per pass at ZeRO-3


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_rank_sends_nothing(stage: int) -> None:
    out = bytes_per_step(stage, 1, TRAINABLE, PARAMS, persistent_param_bytes=1e6)
    assert out["all_reduce"] == out["all_gather"] == out["reduce_scatter"] == 0


def test_zero0_all_reduces_gradients_once_per_step() -> None:
    out = bytes_per_step(0, 4, TRAINABLE, PARAMS, accumulation_steps=8)
    assert out["all_reduce"] == int(2 * 0.75 * GRAD * TRAINABLE)
    assert out["all_gather"] == out["reduce_scatter"] == 0


def test_zero2_reduces_every_micro_step_zero1_at_the_boundary() -> None:
    one = bytes_per_step(1, 4, TRAINABLE, PARAMS, accumulation_steps=8)
    two = bytes_per_step(2, 4, TRAINABLE, PARAMS, accumulation_steps=8)
    assert two["all_reduce"] == 8 * one["all_reduce"]
    assert one["all_gather"] == two["all_gather"] == int(0.75 * GRAD * TRAINABLE)


def test_zero3_gathers_each_pass_and_persistent_parameters_once_per_step() -> None:
    plain = bytes_per_step(3, 2, TRAINABLE, PARAMS, accumulation_steps=4)
    assert plain["all_gather"] == int(4 * 2 * 0.5 * PARAMS)
    assert plain["reduce_scatter"] == int(4 * 0.5 * GRAD * TRAINABLE)
    recompute = bytes_per_step(3, 2, TRAINABLE, PARAMS, accumulation_steps=4, gradient_checkpointing=True)
    assert recompute["all_gather"] == int(4 * 3 * 0.5 * PARAMS)
    persistent = bytes_per_step(3, 2, TRAINABLE, PARAMS, accumulation_steps=4, persistent_param_bytes=1e6)
    # not multiplied by the 4 micro-steps: DeepSpeed re-gathers them after the optimizer step
    assert persistent["all_gather"] - plain["all_gather"] == int(0.5 * 1e6)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_persistent_parameters_only_matter_at_zero3(stage: int) -> None:
    assert bytes_per_step(stage, 4, TRAINABLE, PARAMS, persistent_param_bytes=1e6) == bytes_per_step(
        stage, 4, TRAINABLE, PARAMS
    )


def test_optimizer_offload_moves_the_rank_shard_over_pcie() -> None:
    out = bytes_per_step(2, 4, TRAINABLE, PARAMS, accumulation_steps=2, offload_optimizer="cpu")
    assert out["device_to_host"] == int(2 * GRAD * TRAINABLE / 4)
    assert out["host_to_device"] == int(GRAD * TRAINABLE / 4)
    nvme = bytes_per_step(2, 4, TRAINABLE, PARAMS, offload_optimizer="nvme")
    assert nvme["nvme"] == int(2 * 16 * TRAINABLE / 4)
