"""Which loss a rank trains with: the chunked LM-head loss, unless the model needs full logits.

The chunked path (`chunked_loss`, the one the planner counts) runs
the model through the DeepSpeed engine as before, with the head computing the mean
trained-token cross entropy itself. On CUDA it uses Liger's fused linear cross entropy when
`liger_kernel` is installed, pure-torch chunks otherwise. Models whose head output is
post-processed (soft-capping, scaling), or whose head is adapted or quantised, keep the
model's own full-logits loss; so does `FTJOB_LOSS=logits` (the reference the equivalence
tests compare with). `FTJOB_LOSS_CHUNK_TOKENS` lowers the chunk size (tests use it to
exercise several chunks on a tiny model).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from finetune_kernels.chunked_loss import LossKernel, causal_lm_loss, chunked_cross_entropy_sum, output_head

log = logging.getLogger(__name__)

LOSS_ENV = "FTJOB_LOSS"
CHUNK_ENV = "FTJOB_LOSS_CHUNK_TOKENS"


def _liger_kernel() -> LossKernel | None:
    try:
        from liger_kernel.transformers.functional import (  # type: ignore[import-not-found]
            liger_fused_linear_cross_entropy,
        )
    except ImportError:
        return None

    def kernel(hidden: Any, weight: Any, targets: Any) -> Any:
        return liger_fused_linear_cross_entropy(hidden, weight, targets, reduction="sum").float()

    return kernel


def _torch_kernel(chunk: int | None) -> LossKernel:
    def kernel(hidden: Any, weight: Any, targets: Any) -> Any:
        return chunked_cross_entropy_sum(hidden, weight, targets, chunk)

    return kernel


@dataclass(frozen=True)
class TrainingLoss:
    """`loss(engine, inputs)`: the micro-batch's mean loss over trained tokens."""

    head: Any
    kernel: LossKernel | None
    name: str

    def __call__(self, engine: Any, inputs: dict[str, Any]) -> Any:
        if self.head is None:
            return engine(**inputs).loss
        return causal_lm_loss(engine, self.head, inputs, self.kernel)


def training_loss(model: Any, on_gpu: bool) -> TrainingLoss:
    """The loss path for `model` (before `deepspeed.initialize`; the head module stays the same object)."""
    if os.environ.get(LOSS_ENV, "chunked") == "logits":
        return TrainingLoss(None, None, f"full logits ({LOSS_ENV}=logits)")
    head = output_head(model)
    if head is None:
        return TrainingLoss(None, None, "full logits (this model's LM head output is not a plain linear map)")
    chunk = int(os.environ[CHUNK_ENV]) if os.environ.get(CHUNK_ENV) else None
    liger = _liger_kernel() if on_gpu and chunk is None else None
    if liger is not None:
        return TrainingLoss(head, liger, "Liger fused linear cross entropy")
    return TrainingLoss(head, _torch_kernel(chunk), "chunked cross entropy")
