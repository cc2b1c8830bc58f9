"""QLoRA on CPU: an evaluation does not change the model that trains (issue #14).

bitsandbytes repacks a 4-bit layer for its bf16 CPU inference kernel on the first forward
in eval mode without gradients, when the CPU has AVX512-BF16. The trainer evaluates before
its first step, so a fresh run trained on the repacked base (absmax rounded to bf16, and no
gradient back through the frozen base) while a resumed run, which does not evaluate first,
trained on the original one: resumed QLoRA runs could not continue the interrupted ones.
`modeling.keep_4bit_training_layout` keeps the training layout for the whole run.

Measured without the fix (bitsandbytes 0.50.2, a CPU with AVX512-BF16): loss 6.251570
without an evaluation, 6.251522 after one, LoRA gradients 82 % apart. On a CPU without
AVX512-BF16 bitsandbytes never repacks and the two models agree with or without the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import qlora_model

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def _training_step(model: Any, ids: Any) -> tuple[float, Any]:
    import torch

    model.train()
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def _evaluate(model: Any, ids: Any) -> None:
    """What `evaluation.eval_loss` does to the model: eval mode, no gradients."""
    import torch

    model.eval()
    with torch.no_grad():
        model(input_ids=ids)


def test_an_evaluation_leaves_the_4bit_base_as_it_trains(tiny_model_dir: Path) -> None:
    import torch

    ids = torch.randint(3, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    resumed = qlora_model(tiny_model_dir)  # a resumed run: no evaluation before its first step
    fresh = qlora_model(tiny_model_dir)  # a fresh run evaluates first
    _evaluate(fresh, ids)

    loss, grads = _training_step(resumed, ids)
    loss_after_eval, grads_after_eval = _training_step(fresh, ids)
    difference = float((grads_after_eval - grads).norm() / grads.norm())
    assert loss_after_eval == loss, f"loss {loss_after_eval!r} after an evaluation, {loss!r} without"
    assert torch.equal(grads_after_eval, grads), f"LoRA gradients {difference:.1%} apart"
    states = [getattr(m.weight, "quant_state", None) for m in fresh.modules() if hasattr(m, "weight")]
    repacked = [s for s in states if s is not None and getattr(s, "packing_format_for_cpu", False)]
    assert not repacked
