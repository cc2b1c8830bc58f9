"""Packing correctness: a packed sequence gives every sample exactly the loss it gets alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finetune_trainer.data.batching import collate, pack, unpacked
from finetune_trainer.data.formats import IGNORE_INDEX, tokenize_record

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]


def _token_losses(model: Any, batch: dict[str, Any]) -> tuple[Any, Any, Any]:
    import torch

    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask") if k in batch}
    logits = model(**inputs).logits.float()
    labels = batch["labels"]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(labels[:, 1:].shape)
    return losses, labels[:, 1:] != IGNORE_INDEX, model(**inputs, labels=labels).loss


def test_packed_loss_equals_mean_of_per_sample_losses(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    texts = [("red fox", "fox red"), ("one two six ten big", "big ten six two one"), ("sun", "sun"), ("a b c", "c b a")]
    samples = [
        tokenize_record(
            {"messages": [{"role": "user", "content": i}, {"role": "assistant", "content": o}]}, "messages", tok, 128
        )
        for i, o in texts
    ]
    assert all(s is not None for s in samples)
    rows = pack([s for s in samples if s], max_len=128)
    assert len(rows) == 1 and len(rows[0].lengths) == 4
    with torch.no_grad():
        packed_losses, packed_valid, packed_mean = _token_losses(model, collate(rows, tok.pad_token_id))
        singles = []
        sums = []
        counts = []
        for row in unpacked([s for s in samples if s]):
            losses, valid, _ = _token_losses(model, collate([row], tok.pad_token_id))
            singles.append(losses[valid])
            sums.append(float(losses[valid].sum()))
            counts.append(int(valid.sum()))
    # token by token, the packed sequence reproduces each sample's own losses, in order
    assert torch.allclose(packed_losses[packed_valid], torch.cat(singles), atol=1e-5)
    # so the packed batch loss is the (token-weighted) mean of the per-sample losses
    assert float(packed_mean) == pytest.approx(sum(sums) / sum(counts), rel=1e-5)


def test_without_the_mask_samples_would_leak(tiny_model_dir: Path) -> None:
    """Control: plain causal attention over the packed row changes later samples' losses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    samples = [tokenize_record({"text": t}, "text", tok, 64) for t in ("red fox blue owl", "cat dog sun moon")]
    rows = pack([s for s in samples if s], max_len=64)
    batch = collate(rows, tok.pad_token_id)
    with torch.no_grad():
        masked = _token_losses(model, batch)[0]
        leaky = _token_losses(model, {**batch, "attention_mask": torch.ones_like(batch["input_ids"])})[0]
    assert not torch.allclose(masked, leaky, atol=1e-4)
