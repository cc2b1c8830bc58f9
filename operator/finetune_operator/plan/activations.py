"""Bytes autograd keeps for backward: the activation and logits terms of the memory model.

The per-layer inventory follows what a transformers decoder layer saves, with
flash/memory-efficient attention (no s² term unless the family needs eager attention):

- each input RMSNorm saves its fp32 input and its 16-bit output, `(4 + e)·h` per token;
  Gemma-2's two extra post-norms save their fp32 input, `4·h`;
- attention saves q, k and v (after repeat for grouped-query attention), and the output,
  `4·e·q`, plus a log-sum-exp and rotary tables (a small per-layer constant);
- the gated MLP saves the gate input, the activation, the up projection and their product,
  `4·e·I` (MoE: for each routed expert, plus the gathered and weighted token copies);
- full fine-tuning additionally keeps the 16-bit inputs the norm weights need;
- LoRA dropout saves a mask and a dropped copy of every adapted input, `(1 + e)` bytes each;
- packed rows on CPU carry an explicit block-diagonal mask (no varlen kernel there), and the
  attention then keeps its `b·heads·s²` scores and probabilities per layer;
- peft adapts fused MoE expert weights by materialising `W + B·A`, kept per layer.

With gradient checkpointing each layer keeps only its 16-bit input; the layer being
recomputed in backward adds one layer's activations and the gradients flowing through
it (`2·e·(I + h)`), which is the peak when the vocabulary is small. The loss runs in chunks
(`api/loss_chunks.py`): one chunk of logits plus the trained tokens' hidden states, whatever the
sequence length. Soft-capped heads keep the full logits, `b·s·V` in 16 bits plus the fp32
upcast, log-softmax and its gradient (about 14 bytes per vocabulary entry per token). In full
fine-tuning the gradient of the largest single weight tensor (the output head `e·V·h`, or a
fused MoE expert weight) appears whole before it is handed to DeepSpeed. The constants were
calibrated against `traced.py` (transformers 5.x, torch 2.x) on the catalogue families;
`benchmarks/planner_traced_vs_analytical.py` prints the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.loss_chunks import chunked_loss_bytes
from .param_count import ArchitectureShape
from .workload import Workload, per_workload

LOGIT_BYTES_PER_VOCAB = 12
SOFTCAP_EXTRA_BYTES_PER_VOCAB = 2
ATTENTION_CONSTANT_BYTES = 1400
"""Per token per layer: log-sum-exp per head and rotary cos/sin tables (measured ≈1.4 kB)."""
EAGER_ATTENTION_BYTES_PER_SCORE = 8
"""Families whose soft-capped attention runs eagerly keep scores and probabilities (bf16 + fp32)."""
PACKED_MASK_BYTES_PER_ENTRY = 16
"""Per entry of the `b·s·s` block-diagonal mask of a packed CPU batch: the boolean mask and the
attention's additive fp32 copy and temporaries (measured on CPU SDPA: ≈16 bytes, not per layer)."""
PACKED_CPU_ATTENTION_BYTES_PER_SCORE = 24
"""Per attention score (`b·heads·s·s`) per layer of a packed CPU batch: with an explicit mask the
attention keeps its fp32 scores and probabilities for backward, plus transients. Calibrated on
real CPU ranks (`benchmarks/planner_vs_cpu_peak.py`, tiny-llama, LoRA, s=512): 23.7."""


@dataclass(frozen=True)
class FamilyActivationTraits:
    post_norms: int = 0
    full_extra_hidden_units: int = 2
    eager_attention: bool = False
    fused_qkv: bool = False


FAMILY_TRAITS: dict[str, FamilyActivationTraits] = {
    "llama": FamilyActivationTraits(),
    "mistral": FamilyActivationTraits(),
    "mixtral": FamilyActivationTraits(),
    "qwen2": FamilyActivationTraits(),
    "gemma2": FamilyActivationTraits(post_norms=2, full_extra_hidden_units=8, eager_attention=True),
    "phi3": FamilyActivationTraits(fused_qkv=True),
}


@dataclass(frozen=True)
class ActivationBytes:
    """Per-GPU bytes for one micro-batch: what layers keep, and the logits/loss peak."""

    activations: int
    logits: int


@per_workload
def layer_bytes_per_token(workload: Workload) -> float:
    """What one decoder layer keeps for backward, per token, without checkpointing."""
    shape: ArchitectureShape = workload.shape
    traits = FAMILY_TRAITS.get(shape.family, FamilyActivationTraits())
    e = workload.param_bytes
    h, q, inter = shape.hidden_size, shape.q_dim, shape.intermediate_size
    per_token = 2 * (4 + e) * h + traits.post_norms * 4 * h
    per_token += 4 * e * q + ATTENTION_CONSTANT_BYTES
    if traits.eager_attention:
        per_token += EAGER_ATTENTION_BYTES_PER_SCORE * shape.num_heads * workload.seq_len
    if workload.packing and workload.on_cpu:
        per_token += PACKED_CPU_ATTENTION_BYTES_PER_SCORE * shape.num_heads * workload.seq_len
    if traits.fused_qkv:
        per_token += e * (q + 2 * shape.kv_dim)
    routed = shape.experts_per_token if shape.num_experts > 1 else 1
    per_token += routed * 4 * e * inter
    if shape.num_experts > 1:
        per_token += 2 * routed * e * h
    if workload.method == "full":
        per_token += traits.full_extra_hidden_units * e * h
    elif workload.lora_dropout > 0:
        per_token += (1 + e) * workload.counts.adapted_inputs_per_layer
    if workload.method != "full":
        per_token += e * workload.counts.adapted_ranks_per_layer
    return float(per_token)


@per_workload
def materialised_expert_bytes_per_layer(workload: Workload) -> int:
    """peft's LoRA on fused expert weights keeps `W + B·A` for backward, per layer."""
    shape = workload.shape
    if workload.method == "full" or shape.num_experts <= 1 or workload.counts.adapter == 0:
        return 0
    expert_params = sum(g.params_each for g in shape.groups if g.kind == "experts")
    return workload.param_bytes * expert_params


def loss_bytes(workload: Workload, tokens: int) -> int:
    """The logits/loss peak: one chunk of the chunked loss (`api/loss_chunks.py`), or the full logits
    where the trainer keeps them (soft-capped heads). In full fine-tuning the largest weight's
    gradient (the head's, accumulated chunk by chunk) is whole before DeepSpeed takes it."""
    shape, e = workload.shape, workload.param_bytes
    largest = max(g.experts * g.in_features * g.out_features for g in shape.groups) if workload.method == "full" else 0
    if not shape.logit_softcapping:
        return chunked_loss_bytes(shape.vocab_size, shape.hidden_size, tokens, e) + e * largest
    per_vocab = LOGIT_BYTES_PER_VOCAB + SOFTCAP_EXTRA_BYTES_PER_VOCAB
    return max(int(per_vocab * shape.vocab_size * tokens), e * shape.vocab_size * tokens + e * largest)


def packed_mask_bytes(workload: Workload, micro_batch: int) -> int:
    """The block-diagonal mask of packed rows, built where flash-attention's varlen kernel is not used.

    The trainer builds it on CPU; on GPU the plan assumes flash-attention (position ids only).
    Packed rows are always full `maxSeqLength` rows, which the token count already assumes.
    """
    if not (workload.packing and workload.on_cpu):
        return 0
    return PACKED_MASK_BYTES_PER_ENTRY * micro_batch * workload.seq_len**2


def activation_bytes(workload: Workload, micro_batch: int, checkpointing: bool) -> ActivationBytes:
    """Activation and logits bytes at the backward peak for `micro_batch` sequences."""
    shape = workload.shape
    tokens = micro_batch * workload.seq_len
    e = workload.param_bytes
    layer = layer_bytes_per_token(workload) * tokens + materialised_expert_bytes_per_layer(workload)
    outside_layers = (4 + 2 * e) * shape.hidden_size * tokens + packed_mask_bytes(workload, micro_batch)
    logits = loss_bytes(workload, tokens)
    if checkpointing:
        kept = shape.num_layers * e * shape.hidden_size * tokens
        backward_transient = 2 * e * (shape.intermediate_size + shape.hidden_size) * tokens
        recompute_excess = max(0.0, layer + backward_transient - logits)
        return ActivationBytes(int(kept + outside_layers + recompute_excess), logits)
    return ActivationBytes(int(shape.num_layers * layer + outside_layers), logits)
