"""The causal-LM loss without the full logits: LM head and cross entropy in chunks of tokens.

A model's own forward builds `batch × seq × vocabulary` logits, upcasts them to fp32 and
keeps them, their softmax and their gradient: gigabytes at a 128k vocabulary. Here only
positions whose shifted label is trained (`!= -100`: not prompt, padding or the first
token of a packed sample) reach the head, in chunks of `loss_chunk_tokens(V)` tokens; each
chunk's logits are upcast on their own, reduced to a log-sum-exp, dropped, and recomputed
in backward. The loss and gradients equal the full-logits path (the same matmul in the
model's dtype, then fp32).

The head module itself computes the loss (`head_computes_loss` swaps its `forward` for one
call): DeepSpeed ZeRO-3 gathers a module's partitioned weight around its forward and again
before the backward of its outputs, so the loss must be that module's output. The model's
forward is otherwise unchanged (peft, gradient checkpointing, packing masks, ZeRO hooks).

Shared by the trainer (`finetune_trainer.model.loss`) and the traced planner
(`finetune_operator.plan.search.traced`), which must measure the same step; the byte count it implies
is `api.loss_chunks.chunked_loss_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from finetune_operator.api.loss_chunks import HEAD_POSTPROCESSING_ATTRIBUTES, IGNORE_INDEX, loss_chunk_tokens

LossKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(hidden [n, h], head weight [V, h], targets [n]) → the summed cross entropy, fp32."""


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Σ cross_entropy(hidden @ weightᵀ, targets), chunk by chunk; backward recomputes each chunk."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            logits = torch.nn.functional.linear(hidden[part], weight).float()
            target = logits.gather(1, targets[part, None]).squeeze(1)
            top = logits.amax(dim=-1)
            # log-sum-exp in place: torch.logsumexp would allocate two more chunk-sized temporaries
            lse[part] = logits.sub_(top[:, None]).exp_().sum(dim=-1).log_().add_(top)
            total += (lse[part] - target).sum()
            del logits
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        hidden, weight, targets, lse = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight) if want_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            probs = torch.nn.functional.linear(hidden[part], weight).float()
            probs.sub_(lse[part, None]).exp_()  # softmax, in place
            rows = torch.arange(probs.shape[0], device=probs.device)
            probs[rows, targets[part]] -= 1.0
            probs.mul_(grad)
            step = probs.to(hidden.dtype)
            del probs
            if grad_hidden is not None:
                grad_hidden[part] = step.to(weight.dtype) @ weight
            if grad_weight is not None:
                grad_weight.addmm_(step.to(weight.dtype).t(), hidden[part].to(weight.dtype))
            del step  # else it lives on beside the next chunk's logits: 2 more bytes per logit at the peak
        return grad_hidden, grad_weight, None, None


def chunked_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int | None = None
) -> torch.Tensor:
    """The summed cross entropy of `hidden @ weightᵀ` against `targets`, never holding more than a chunk."""
    size = chunk if chunk is not None else loss_chunk_tokens(weight.shape[0])
    out: torch.Tensor = _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, max(1, size))  # type: ignore[no-untyped-call]
    return out


def trained_positions(
    hidden: torch.Tensor, labels: torch.Tensor, select: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states [n, h] of the positions whose next-token label is trained, and those labels [n].

    `select=False` keeps every position, for labels known to be all trained: the traced
    planner's fake tensors cannot take a data-dependent selection (the copy is the same size).
    """
    targets = labels[:, 1:]
    if not select:
        return hidden[:, :-1].reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    keep = targets != IGNORE_INDEX
    return hidden[:, :-1][keep], targets[keep]


def output_head(model: Any) -> torch.nn.Linear | None:
    """The plain Linear that computes the logits (through peft's modules_to_save), or None
    when the loss cannot be chunked for this model: no separate head, a bias, an adapted or
    quantised head, or a config that post-processes the logits (soft-capping, scaling)."""
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in HEAD_POSTPROCESSING_ATTRIBUTES):
        return None
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    copies = getattr(head, "modules_to_save", None)
    if isinstance(copies, torch.nn.ModuleDict):  # peft trains a copy of the head
        active = list(getattr(head, "active_adapters", []))
        if getattr(head, "disable_adapters", False) or not active or active[0] not in copies:
            head = getattr(head, "original_module", None)
        else:
            head = copies[active[0]]
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    return head


@contextmanager
def head_computes_loss(
    head: torch.nn.Linear, labels: torch.Tensor, kernel: LossKernel | None = None, select: bool = True
) -> Iterator[list[torch.Tensor]]:
    """While active, the next call of `head` returns the mean trained-token loss instead of logits.

    The model's forward then returns that scalar as its `logits`; the yielded list receives
    the tensor the head returned, so the caller can check it was called once.
    """
    computed: list[torch.Tensor] = []
    loss_sum = kernel or chunked_cross_entropy_sum

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        selected, targets = trained_positions(hidden, labels, select)
        count = max(1, int(targets.numel()))
        loss = loss_sum(selected, head.weight, targets) / count
        computed.append(loss)
        return loss

    head.forward = forward  # type: ignore[method-assign,assignment]
    try:
        yield computed
    finally:
        del head.forward


def causal_lm_loss(
    model: Any, head: torch.nn.Linear, inputs: dict[str, Any], kernel: LossKernel | None = None, select: bool = True
) -> torch.Tensor:
    """The model's mean next-token loss over trained labels, through `model(**inputs)` (labels
    taken out, so the model computes no loss of its own), with the head computing it in chunks."""
    rest = {k: v for k, v in inputs.items() if k != "labels"}
    with head_computes_loss(head, inputs["labels"], kernel, select) as computed:
        out = model(**rest)
    # ZeRO-3 wraps a module's outputs for its backward hooks: the same value, another tensor object
    logits = out.logits if hasattr(out, "logits") else out[0]
    if len(computed) != 1 or logits.dim() != 0:
        raise RuntimeError(
            f"the chunked loss needs {type(model).__name__} to call its LM head once per forward and return "
            "its output as the logits; it did not, so this model needs the full-logits loss"
        )
    loss: torch.Tensor = logits
    return loss
