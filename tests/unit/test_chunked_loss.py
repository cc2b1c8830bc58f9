"""The chunked LM-head loss equals the full-logits loss, in value and gradients, on tiny tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from finetune_kernels.chunked_loss import (
    causal_lm_loss,
    chunked_cross_entropy_sum,
    output_head,
    trained_positions,
)
from finetune_operator.api.loss_chunks import IGNORE_INDEX, chunked_loss_bytes, loss_chunk_tokens


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight).float()
    return torch.nn.functional.cross_entropy(logits, targets, reduction="sum")


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("train_weight", [True, False])
def test_loss_and_gradients_equal_the_full_logits(chunk: int, train_weight: bool) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 8, dtype=torch.float64, requires_grad=train_weight)
    targets = torch.randint(0, 11, (13,))
    ours = chunked_cross_entropy_sum(hidden, weight, targets, chunk)
    grads = torch.autograd.grad(ours * 0.37, [hidden, weight] if train_weight else [hidden])
    ref = _reference(hidden, weight, targets)
    ref_grads = torch.autograd.grad(ref * 0.37, [hidden, weight] if train_weight else [hidden])
    assert ours.dtype == torch.float32
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)


def test_gradcheck() -> None:
    torch.manual_seed(1)
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (5,))
    # the forward accumulates in fp32: compare the analytical gradient at fp32 precision
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_cross_entropy_sum(h, w, targets, 2).double(), (hidden, weight), eps=1e-3, atol=1e-3
    )


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    """The gradient the last backward pass left on `leaf`."""
    assert leaf.grad is not None
    return leaf.grad


def test_low_precision_matches_the_model_dtype_path() -> None:
    torch.manual_seed(2)
    hidden = torch.randn(9, 16, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(32, 16, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 32, (9,))
    ours = chunked_cross_entropy_sum(hidden, weight, targets, 4)
    ours.backward()
    got = _grad(hidden).clone(), _grad(weight).clone()
    hidden.grad = weight.grad = None
    _reference(hidden, weight, targets).backward()
    assert float(ours.detach()) == pytest.approx(float(_reference(hidden, weight, targets).detach()), rel=1e-5)
    assert torch.allclose(got[0].float(), _grad(hidden).float(), rtol=2e-2, atol=1e-2)
    assert torch.allclose(got[1].float(), _grad(weight).float(), rtol=2e-2, atol=1e-2)


def test_only_trained_positions_reach_the_head() -> None:
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 5, 6], [IGNORE_INDEX, 7, IGNORE_INDEX, IGNORE_INDEX]])
    selected, targets = trained_positions(hidden, labels)
    assert selected.view(-1).tolist() == [1.0, 2.0, 4.0]  # position t predicts label t + 1
    assert targets.tolist() == [5, 6, 7]


def _tiny_llama(tied: bool = False) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).float()


def _batch(packed: bool) -> dict[str, torch.Tensor]:
    from finetune_trainer.data.batching import Row, collate, pack, unpacked
    from finetune_trainer.data.formats import Sample

    samples = [
        Sample((1, 5, 9, 11, 13), (IGNORE_INDEX, IGNORE_INDEX, 9, 11, 13)),
        Sample((1, 7, 8, 20, 21, 22, 23), (IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 20, 21, 22, 23)),
        Sample((1, 40, 41), (IGNORE_INDEX, 40, 41)),
    ]
    rows: list[Row] = pack(samples, 16) if packed else unpacked(samples)
    return {k: v for k, v in collate(rows, 0).items() if isinstance(v, torch.Tensor)}


def _step(model: Any, loss_of: Any) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = loss_of(model)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("variant", ["full", "tied", "lora", "lora-trained-head"])
def test_model_loss_and_gradients_equal_the_models_own_loss(packed: bool, variant: str) -> None:
    model = _tiny_llama(tied=variant == "tied")
    if variant.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        trained_head = ["lm_head"] if variant == "lora-trained-head" else None
        config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", modules_to_save=trained_head)
        model = get_peft_model(model, config)
        for name, param in model.named_parameters():  # LoRA B starts at 0: give the adapters a gradient path
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.1)
    batch = _batch(packed)
    head = output_head(model)
    assert head is not None
    want_loss, want = _step(model, lambda m: m(**batch).loss)
    for chunk in (1, 5, None):

        def kernel(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, size: int | None = chunk) -> torch.Tensor:
            return chunked_cross_entropy_sum(h, w, t, size)

        got_loss, got = _step(model, lambda m, k=kernel: causal_lm_loss(m, head, batch, k))
        assert got_loss == pytest.approx(want_loss, rel=1e-6)
        assert got.keys() == want.keys() and want
        for name, grad in want.items():
            assert torch.allclose(got[name], grad, rtol=1e-5, atol=1e-7), name
    assert "logits" not in head.__dict__ and "forward" not in head.__dict__  # the head is itself again


def test_heads_that_transform_the_logits_keep_the_full_path() -> None:
    model = _tiny_llama()
    model.config.final_logit_softcapping = 30.0
    assert output_head(model) is None
    biased = _tiny_llama()
    biased.lm_head = torch.nn.Linear(32, 96, bias=True)
    assert output_head(biased) is None


def test_chunk_size_and_bytes() -> None:
    assert loss_chunk_tokens(128_256) == 130
    assert loss_chunk_tokens(10) == 2**24 // 10
    # 8B at 2 × 2048 tokens, bf16: one chunk of the 128k vocabulary plus the trained hidden states
    assert chunked_loss_bytes(128_256, 4096, 4096, 2) < 2**30
    # one chunk (16-bit logits and their fp32 upcast) and two hidden copies (the gathered input, its gradient)
    assert chunked_loss_bytes(128_256, 4096, 4096, 2) == 6 * 130 * 128_256 + 2 * 2 * 4096 * 4096


def test_validation_loss_equals_the_full_logits_token_mean() -> None:
    from finetune_trainer.data.batching import collate, unpacked
    from finetune_trainer.data.formats import Sample
    from finetune_trainer.model.loss import training_loss
    from finetune_trainer.rank.evaluation import eval_loss

    model = _tiny_llama()
    samples = [
        Sample((1, 5, 9, 11, 13), (IGNORE_INDEX, IGNORE_INDEX, 9, 11, 13)),
        Sample((1, 7, 8, 20, 21, 22, 23), (IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 20, 21, 22, 23)),
        Sample((1, 40, 41), (IGNORE_INDEX, 40, 41)),
    ]
    rows = unpacked(samples)
    with torch.no_grad():  # the token-weighted mean, by hand, from the full logits
        batch = collate(rows, 0)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        labels = batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, 96), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        want = float(losses) / int((labels != IGNORE_INDEX).sum())
    loss = training_loss(model, on_gpu=False)
    assert loss.head is not None
    # world 2, rank 1: rows 1 and a zero-weight repeat of it; batch 1 splits the shard in two forwards
    for rank, world, expect in ((0, 1, want), (1, 2, None)):
        got = eval_loss(
            model, rows, rank=rank, world=world, batch=1, pad_id=0,
            all_reduce_sum=lambda v: v, loss=loss,
        )  # fmt: skip
        if expect is not None:
            assert got == pytest.approx(expect, rel=1e-6)
        else:
            with torch.no_grad():
                one = collate([rows[1]], 0)
                alone = model(input_ids=one["input_ids"], labels=one["labels"]).loss
            assert got == pytest.approx(float(alone), rel=1e-6)  # the repeat weighs nothing
