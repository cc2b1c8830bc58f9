"""Measure a training step's activation peak by running it on fake tensors.

The analytical activation term is a model of what autograd saves; this module asks
autograd itself. The job's architecture is built on the meta device, peft is applied,
every parameter becomes a `FakeTensor` (shape and dtype, no data), and one forward and
backward pass runs under a `TorchDispatchMode` that adds up the bytes of live storages
(views share a storage, so storages are counted, not tensors) and keeps the peak. It
costs seconds on a CPU and no memory, and is used with `ftjob plan --traced` and to
calibrate `activations.py`. Imported lazily: it needs torch, transformers and peft.

The loss is the one every rank runs, `finetune_kernels.chunked_loss`, imported from the
package the trainer imports it from: the operator never imports the trainer, and the kernel
lives in neither. Running the measurement in a trainer subprocess that prints JSON was the
other way; it was not taken because the trace is built from the planner's own pieces
(`meta_count`, `workload`), which the trainer may not import, and because every traced plan
would pay a second interpreter's torch, transformers and peft imports (seconds) on top of
its own.

The CPU trace runs PyTorch's CPU flash-attention kernel, which, like the GPU flash
kernel, saves only q, k, v, the output and a log-sum-exp per row, so the number
carries over to GPUs running flash or memory-efficient attention. Dropout is the one op
whose CPU kernel keeps more than the GPU's (a mask in the input's dtype, not a boolean):
the trace runs it as CUDA does (`FusedDropout`) unless asked for a CPU rank's.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from finetune_kernels.chunked_loss import causal_lm_loss, output_head
from finetune_operator.plan.counting.meta_count import apply_lora, build_meta_model
from finetune_operator.plan.counting.param_count import architecture_shape
from finetune_operator.plan.workload import adapts_fused_experts


@dataclass(frozen=True)
class TracedStep:
    """Bytes of storages created during one step, beyond the parameters themselves.

    `trainable_grad_bytes` is the size of the gradients the step produced (each one was
    dropped as soon as it was complete, so they never add up inside the peak).
    """

    peak_bytes: int
    trainable_grad_bytes: int
    seconds: float

    @property
    def activation_peak_bytes(self) -> int:
        """The peak; gradients are handed over as soon as they are complete, so it is activations,
        logits and the transient gradients of the layer being back-propagated."""
        return self.peak_bytes


class LiveStorageBytes(TorchDispatchMode):
    """Counts the bytes of every storage an op creates until that storage is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: set[int] = set()
        self._ignored: set[int] = set()

    def ignore(self, tensors: Any) -> None:
        """Storages that existed before the step (parameters, buffers): never counted."""
        for tensor in tensors:
            self._ignored.add(tensor.untyped_storage()._cdata)

    def _release(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._tracked or key in self._ignored:
            return
        nbytes = storage.nbytes()
        self._tracked.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, key, nbytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(output):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return output


def _fake_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Replace meta parameters and buffers with fake CPU tensors created in their final dtype."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            target = dtype if param.is_floating_point() else param.dtype
            module._parameters[name] = torch.nn.Parameter(
                torch.empty(param.shape, dtype=target), requires_grad=param.requires_grad
            )
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype)


def trace_training_step(
    config: dict[str, Any],
    micro_batch: int,
    seq_len: int,
    *,
    lora_r: int | None,
    target_modules: Sequence[str] = ("all-linear",),
    lora_dropout: float = 0.05,
    gradient_checkpointing: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    cuda_dropout: bool = True,
) -> TracedStep:
    """One forward + backward of the job's model under fake tensors; the peak of new storages.

    `cuda_dropout`: run dropout as CUDA does (see `FusedDropout`); False keeps a CPU rank's."""
    import time

    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    model: Any = build_meta_model(config, dtype=dtype)
    if lora_r is not None:
        # peft adapts fused MoE expert weights through ParamWrapper, which rejects dropout (the plan's rule).
        fused_experts = adapts_fused_experts(architecture_shape(config), target_modules)
        dropout = 0.0 if fused_experts else lora_dropout
        model = apply_lora(model, lora_r, target_modules, dropout=dropout)
    if cuda_dropout:
        _dropout_as_on_cuda(model)
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with FakeTensorMode(allow_non_fake_inputs=True):
        _fake_parameters(model, dtype)
        tokens = torch.zeros((micro_batch, seq_len), dtype=torch.long)
        mask = torch.ones((micro_batch, seq_len), dtype=torch.long)
        counter = LiveStorageBytes()
        counter.ignore([*model.parameters(), *model.buffers()])
        grad_bytes = _hand_gradients_over(model)
        with counter:
            inputs = {"input_ids": tokens, "attention_mask": mask, "labels": tokens, "use_cache": False}
            head = output_head(model)  # None: the trainer keeps the model's full-logits loss too
            loss = model(**inputs).loss if head is None else causal_lm_loss(model, head, inputs, select=False)
            loss.backward()
    return TracedStep(counter.peak, sum(grad_bytes.values()), time.perf_counter() - started)


class FusedDropout(torch.nn.Module):
    """Dropout as CUDA runs it: `torch.dropout` on a GPU tensor calls the fused `native_dropout`,
    which keeps a boolean mask for backward; on a CPU tensor it multiplies by a mask in the
    input's dtype (2 bytes, not 1, per element in bf16). The trace runs on CPU and plans GPUs."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        out: torch.Tensor = torch.native_dropout(x, self.p, True)[0]
        return out


def _dropout_as_on_cuda(model: torch.nn.Module) -> None:
    """Swap every `nn.Dropout` (LoRA's among them) for `FusedDropout` with the same probability."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Dropout:
                parent._modules[name] = FusedDropout(child.p)


def _hand_gradients_over(model: torch.nn.Module) -> dict[int, int]:
    """Drop each gradient once it is complete, as DeepSpeed does when it copies it to a bucket.

    Without this, a full fine-tuning trace would end with every gradient alive at once and
    its peak would measure gradients, which the model-state terms already count.
    """
    seen: dict[int, int] = {}

    def hand_over(param: torch.Tensor) -> None:
        if param.grad is not None:
            seen[id(param)] = param.grad.untyped_storage().nbytes()
            param.grad = None

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(hand_over)  # type: ignore[no-untyped-call]
    return seen
