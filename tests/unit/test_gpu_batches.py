"""The GPU acceptance's batches are the trainer's own, and its MFU arithmetic is PaLM's.

Why: the first GPU run fed all-ones masks, so neither padded rows nor packed rows (with their
block-diagonal mask) ever reached a GPU. These checks are cheap; the dry run in the trainer tier
(tests/trainer/test_gpu_acceptance_dry_run.py) trains on the same batches.
"""

from __future__ import annotations

import pytest

from benchmarks.gpu_batches import flops_per_token, peak_flops, real_batch


def test_padded_rows_are_right_padded_to_the_longest_with_a_padding_mask() -> None:
    batch = real_batch(vocab=100, seq=32, micro=3, packed=False, seed=1)
    assert tuple(batch["input_ids"].shape) == (3, 32)
    mask = batch["attention_mask"]
    assert mask.dim() == 2 and bool(mask[0].all()), "the first row is full length"
    assert int(mask.sum()) == batch["useful_tokens"] < 3 * 32, "the other rows are shorter: padding"
    assert batch["trained_tokens"] < batch["useful_tokens"], "the prompt part carries no labels"


def test_packed_rows_carry_several_samples_and_a_block_diagonal_mask() -> None:
    batch = real_batch(vocab=100, seq=64, micro=2, packed=True, seed=1)
    mask = batch["attention_mask"]
    assert mask.dim() == 4 and tuple(mask.shape[-2:]) == (batch["input_ids"].shape[1],) * 2
    assert batch["samples"] > 2, "several samples share a row"
    positions = batch["position_ids"][0].tolist()
    assert positions.count(0) > 1, "position ids restart at each packed sample"


def test_flops_per_token_follows_palm_with_and_without_weight_gradients() -> None:
    full = flops_per_token(params=1_000, layers=2, hidden=8, seq=16, base_trains=True)
    adapter = flops_per_token(params=1_000, layers=2, hidden=8, seq=16, base_trains=False)
    assert full == 3 * (2 * 1_000 + 4 * 2 * 8 * 16)
    assert adapter == pytest.approx(full * 2 / 3)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [("NVIDIA H200", 989.4), ("NVIDIA GH200 480GB", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.1)],
)
def test_peak_flops_from_the_device_name(name: str, tflops: float) -> None:
    assert peak_flops(name) == pytest.approx(tflops * 1e12)


def test_an_unknown_card_has_no_peak_so_no_mfu() -> None:
    assert peak_flops("Some Accelerator 9000") is None
