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

from tests.support.training_runs import qlora_model

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


def _plan(zero_stage: int) -> Any:
    from finetune_operator.api.status import PlanStatus

    return PlanStatus(zero_stage=zero_stage, offload_optimizer="none", offload_params="none",
                      gradient_checkpointing=True, micro_batch_size=1, gradient_accumulation_steps=1,
                      per_gpu_bytes=0, gpu_memory_bytes=0)  # fmt: skip


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_the_packed_4bit_weights_are_stored_in_the_precision_deepspeed_casts_to(zero_stage: int) -> None:
    """Under ZeRO-3 DeepSpeed casts every floating-point parameter to the job's precision: packed
    4-bit weights stored in another float dtype (the compute dtype float16 here) would be converted
    as numbers. Below ZeRO-3 they stay uint8, which DeepSpeed does not cast."""
    import torch

    from finetune_operator.api.job import FineTuneJob
    from finetune_trainer.model.modeling import quantization_config
    from tests.support.training_runs import job_manifest

    manifest = job_manifest("/models/m", "/data/d.jsonl", "/out",
                            method={"type": "qlora", "qlora": {"computeDtype": "float16"}},
                            training={"precision": "bf16"})  # fmt: skip
    spec = FineTuneJob.from_manifest(manifest).spec
    config = quantization_config(spec, _plan(zero_stage), torch.bfloat16)
    assert config.bnb_4bit_compute_dtype == torch.float16
    assert config.bnb_4bit_quant_storage == (torch.bfloat16 if zero_stage == 3 else torch.uint8)


def test_a_4bit_base_keeps_its_unquantised_weights_16bit_and_trains_only_the_adapters(tiny_model_dir: Path) -> None:
    """peft's k-bit preparation would cast embeddings, head and norms to fp32 (DeepSpeed casts them
    back): the trainer keeps them in the job's precision, so loading holds what the planner counts."""
    import torch

    model = qlora_model(tiny_model_dir)
    base = {n: p for n, p in model.named_parameters() if "lora_" not in n and p.__class__.__name__ != "Params4bit"}
    assert base and {p.dtype for p in base.values()} == {torch.bfloat16}, {n: p.dtype for n, p in base.items()}
    assert all(not p.requires_grad for p in base.values())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.randint(3, 512, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()  # gradient checkpointing reaches the adapters
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
