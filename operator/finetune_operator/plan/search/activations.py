"""Bytes autograd keeps for backward: the activation and logits terms of the memory model.

The per-layer inventory is what a transformers decoder layer saves, tensor by tensor, with
flash/memory-efficient attention (no s² term unless the family needs eager attention). A
tensor is kept when some op's backward needs it, so what LoRA keeps differs from full
fine-tuning: a frozen base linear keeps nothing, a trained weight keeps its input.

- every RMSNorm keeps its fp32 input, `4·h`; a trained norm weight also its normalised input;
  norms on the queries and keys (Qwen 3, Gemma 3, OLMo 2) do the same over `q + kv`;
- attention keeps q and k after the rotary, v (k and v repeated for grouped-query attention),
  and the kernel's output and log-sum-exp, `4·e·q`, and the additive copy of the explicit mask
  every batch carries (padded or packed rows: the image ships no varlen kernel), `e·s` per
  token; eager (Gemma 2): the scores and probabilities instead, gpt-oss (sinks): the probabilities only;
- the gated MLP keeps the gate and up outputs and the activation, `3·e·I` (MoE: for each
  routed expert, with the gathered token copies, the product and the expert outputs);
- linear inputs: full fine-tuning keeps each distinct one (the norms' outputs, the product);
  LoRA with dropout keeps, for every adapted module, the dropped copy and the mask (CUDA's
  is boolean: `(e + 1)` bytes per element); LoRA without dropout keeps the shared input;
- in LoRA nothing upstream of the first layer's adapted modules needs a gradient: its first
  norm and the masks of the dropouts on that norm's output are not kept (a post-norm family's
  first norm reads the attention's output, which does need one);
- packed rows carry an explicit block-diagonal mask (no varlen kernel in the image); on CPU the
  attention then keeps its `b·heads·s²` scores and probabilities per layer;
- peft adapts fused MoE expert weights by materialising `W + B·A`, kept per layer.

The peak is the larger of the loss (every layer's activations, or with checkpointing every
layer's 16-bit input, plus the final norm and the loss chunk, or the final norm's backward
when the tokens are many) and the backward of one layer (with checkpointing, recomputed first):
its transients, the MLP product's gradients, or a large weight gradient whole before DeepSpeed
takes it. The loss runs in chunks (`api/loss_chunks.py`): one chunk of logits plus the trained
tokens' hidden states, whatever the sequence length; full fine-tuning adds the head's
gradient. Soft-capped or scaled heads (Gemma 2, Granite) keep the full logits, `b·s·V` in 16
bits plus the fp32 upcast, log-softmax and its gradient (about 12 bytes per vocabulary entry
per token, 14 with the soft-cap's tanh). Every term matches `traced.py` (transformers 5.x,
torch 2.x) on the catalogue's models within 2 % (gpt-oss with checkpointing: 4 %)
(`benchmarks/planner_traced_vs_analytical.py`; `tests/unit/test_plan_traced.py` holds 5 %).
Where the families differ is `activation_traits.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune_operator.api.loss_chunks import chunked_loss_bytes
from finetune_operator.plan.counting.activation_traits import FamilyActivationTraits, family_traits
from finetune_operator.plan.workload import Workload, per_workload

LOGIT_BYTES_PER_VOCAB = 12
SOFTCAP_EXTRA_BYTES_PER_VOCAB = 2
LOG_SUM_EXP_BYTES = 4
"""Per head per token: the fp32 log-sum-exp a flash or memory-efficient kernel keeps for backward."""
NORM_BACKWARD_BYTES_PER_UNIT = 20
"""An RMSNorm's backward holds five fp32 temporaries of the hidden size per token beside its input."""
PACKED_MASK_BYTES_PER_ENTRY = 16
"""Per entry of the `b·s·s` block-diagonal mask of a packed CPU batch: the boolean mask and the
attention's additive fp32 copy and temporaries (measured on CPU SDPA: ≈16 bytes, not per layer)."""
PACKED_CPU_ATTENTION_BYTES_PER_SCORE = 7
"""Per attention score (`b·heads·s·s`) per layer of a packed CPU batch, fitted on real CPU ranks
(`benchmarks/planner_vs_cpu_peak.py`: tiny-llama and SmolLM2-135M, LoRA and full, s=512, where
the excess over the rest of the plan was 2.9-8.3 bytes; 7 keeps all four within 15 % and none
more than 3 % under). It is not saved scores: a trace of saved tensors shows CPU SDPA keeps no
`s·s` tensor for backward, only each layer's fp32 copy of the mask. The rest is the allocator's
high-water mark while each layer's masked attention runs forward and backward."""


ATTENTION_INPUTS = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj"})
MLP_INPUTS = frozenset({"gate_proj", "up_proj", "gate_up_proj"})


@dataclass(frozen=True)
class ActivationBytes:
    """Per-GPU bytes for one micro-batch: what layers keep, and the logits/loss peak."""

    activations: int
    logits: int


def dropout_mask_bytes(workload: Workload) -> int:
    """Bytes per element of a LoRA dropout mask: CUDA's fused dropout keeps a boolean mask, a CPU
    rank multiplies by a mask in the input's dtype."""
    return workload.param_bytes if workload.on_cpu else 1


def _norm_bytes(workload: Workload, traits: FamilyActivationTraits) -> int:
    """Per token: every RMSNorm keeps its fp32 input; a trained norm weight also needs the
    normalised input (16-bit, or fp32 where the family scales in fp32)."""
    e, h = workload.param_bytes, workload.shape.hidden_size
    trained = (4 if traits.fp32_norm_output else e) if workload.traits.base_trains else 0
    return (2 + traits.post_norms) * (4 + trained) * h


def _attention_bytes(workload: Workload, traits: FamilyActivationTraits) -> int:
    """Per token: q and k after the rotary and v (k and v repeated to every head for grouped-query
    attention), and what the kernel keeps: the output and a log-sum-exp (flash), or the scores
    and probabilities (eager)."""
    shape, e, s = workload.shape, workload.param_bytes, workload.seq_len
    q, kv = shape.q_dim, shape.kv_dim
    repeated = shape.num_kv_heads < shape.num_heads
    per_token = e * q + e * (q if repeated else kv)
    if repeated:
        per_token += e * q
    else:
        per_token += e * (q + 2 * kv) if traits.fused_qkv else e * kv
    if traits.eager_attention:
        per_token += eager_score_bytes(e, traits.eager_attention) * shape.num_heads * s
    else:
        per_token += e * q + LOG_SUM_EXP_BYTES * shape.num_heads + e * s  # e·s: the additive mask
    if workload.packing and workload.on_cpu:
        per_token += PACKED_CPU_ATTENTION_BYTES_PER_SCORE * shape.num_heads * s
    return per_token


def eager_score_bytes(param_bytes: int, kind: str = "softcapped") -> int:
    """Per attention score of eager attention. Soft-capped: the fp32 softmax, the soft-capped (tanh)
    scores and the probabilities cast back to the model's dtype (no copy in fp32). With sinks: only
    the softmax's output in the model's dtype (the scores and the sink column are freed)."""
    if kind == "sinks":
        return param_bytes
    return 4 + param_bytes + (param_bytes if param_bytes < 4 else 0)


def _qk_norm_bytes(workload: Workload, traits: FamilyActivationTraits) -> int:
    """Per token: norms on the queries and keys (Qwen 3, Gemma 3, OLMo 2) keep their fp32 inputs, and
    a trained norm weight its normalised input."""
    shape, e = workload.shape, workload.param_bytes
    if not any(g.name == "q_norm" and g.part == "decoder" for g in shape.groups):
        return 0
    trained = (4 if traits.fp32_norm_output else e) if workload.traits.base_trains else 0
    return (4 + trained) * (shape.q_dim + shape.kv_dim)


@per_workload
def _adapted_modules(workload: Workload) -> frozenset[str]:
    """The names of the dense modules LoRA adapts in each layer (a MoE router as `router`)."""
    groups = (a.group for a in workload.adapted)
    return frozenset(
        "router" if g.kind == "router" else g.name for g in groups if g.kind != "experts" and g.part == "decoder"
    )


def _linear_input_bytes(workload: Workload, traits: FamilyActivationTraits) -> int:
    """Per token: the inputs linear layers keep for their weights' gradients.

    A trained weight keeps its input: each distinct input once (q, k and v share the norm's output).
    A frozen base layer keeps nothing; LoRA's A keeps what it reads: with dropout, its own
    dropped copy and the mask (for every adapted module); without, the shared input itself.
    """
    shape, e = workload.shape, workload.param_bytes
    h, q, inter = shape.hidden_size, shape.q_dim, shape.intermediate_size
    dense = shape.num_experts <= 1
    o_copy = e * q if traits.attention_output_copy else 0
    if workload.traits.base_trains:
        return 2 * e * h + o_copy + (e * inter if dense else 0)
    if workload.lora_dropout > 0:
        return (dropout_mask_bytes(workload) + e) * workload.counts.adapted_inputs_per_layer
    adapted = _adapted_modules(workload)
    per_token = e * h if adapted & ATTENTION_INPUTS else 0
    per_token += o_copy if "o_proj" in adapted else 0
    per_token += e * h if adapted & (MLP_INPUTS | {"router"}) else 0
    per_token += e * inter if dense and "down_proj" in adapted else 0
    return per_token


def _mlp_bytes(workload: Workload) -> int:
    """Per token: the gate and up projections' outputs and the activation (the product is the down
    projection's input). A mixture of experts does this for each routed expert, and a trained
    expert also keeps the gathered token copies it reads and the product; the expert outputs
    wait for the routing weights. gpt-oss's clamped gate keeps more: the fused gate-up output, the
    clamped gate, the shifted up, the sigmoid and the gated product."""
    shape, e = workload.shape, workload.param_bytes
    h, inter = shape.hidden_size, shape.intermediate_size
    if shape.num_experts <= 1:
        return 3 * e * inter
    trained = workload.traits.base_trains or workload.adapts_experts
    if family_traits(shape).clamped_experts:
        per_expert = 7 * inter + 2 * h if trained else 6 * inter + h
    else:
        per_expert = 4 * inter + 2 * h if trained else 3 * inter + h
    return shape.experts_per_token * e * per_expert


@per_workload
def layer_bytes_per_token(workload: Workload) -> float:
    """What one decoder layer keeps for backward, per token, without checkpointing."""
    traits = family_traits(workload.shape)
    per_token = _norm_bytes(workload, traits) + _qk_norm_bytes(workload, traits) + _attention_bytes(workload, traits)
    per_token += _linear_input_bytes(workload, traits) + _mlp_bytes(workload)
    if not workload.traits.base_trains:
        per_token += workload.param_bytes * workload.counts.adapted_ranks_per_layer
    return float(per_token)


@per_workload
def materialised_expert_bytes_per_layer(workload: Workload) -> int:
    """peft's LoRA on fused expert weights keeps `W + B·A` for backward, per layer."""
    if not workload.adapts_experts:  # frozen experts, or full fine-tuning's trained ones
        return 0
    expert_params = sum(g.params_each for g in workload.shape.groups if g.kind == "experts")
    return workload.param_bytes * expert_params


def head_gradient_bytes(workload: Workload) -> int:
    """Full fine-tuning: the output head's gradient (the embedding's, when tied), accumulated chunk by
    chunk by the loss and whole before DeepSpeed takes it."""
    if not workload.traits.base_trains:
        return 0
    shape = workload.shape
    return workload.param_bytes * shape.vocab_size * shape.hidden_size


def loss_bytes(workload: Workload, tokens: int) -> int:
    """The logits/loss peak: one chunk of the chunked loss (`api/loss_chunks.py`), or the full logits
    where the trainer keeps them (soft-capped or scaled heads), with the head's gradient in full fine-tuning."""
    shape, e = workload.shape, workload.param_bytes
    head = head_gradient_bytes(workload)
    if not shape.full_logits:
        return chunked_loss_bytes(shape.vocab_size, shape.hidden_size, tokens, e) + head
    per_vocab = LOGIT_BYTES_PER_VOCAB + (SOFTCAP_EXTRA_BYTES_PER_VOCAB if shape.logit_softcapping else 0)
    return max(int(per_vocab * shape.vocab_size * tokens), e * shape.vocab_size * tokens + head)


def packed_mask_bytes(workload: Workload, micro_batch: int) -> int:
    """The block-diagonal mask of packed CPU rows and CPU SDPA's temporaries around it.

    On GPU packed rows carry a `[b,1,s,s]` boolean mask like padded rows do (the trainer runs SDPA:
    the image has no varlen flash-attention kernel), counted with theirs (`_shared_bytes_per_token`).
    Packed rows are always full `maxSeqLength` rows, which the token count already assumes.
    """
    if not (workload.packing and workload.on_cpu):
        return 0
    return PACKED_MASK_BYTES_PER_ENTRY * micro_batch * workload.seq_len**2


def _shared_bytes_per_token(workload: Workload, checkpointing: bool) -> int:
    """Per token, outside the layers for the whole step: the rotary cos/sin tables, and with
    checkpointing the boolean mask of padded rows that every recompute reads (without, each layer
    keeps its own additive copy and the boolean one is freed; packed CPU rows: `packed_mask_bytes`)."""
    shape, e = workload.shape, workload.param_bytes
    mask = workload.seq_len if checkpointing and not (workload.packing and workload.on_cpu) else 0
    return 2 * e * shape.head_dim + mask


def _final_norm_bytes_per_token(workload: Workload) -> int:
    """The final norm's saved input (and normalised input, when its weight trains); the loss holds
    its output."""
    traits = family_traits(workload.shape)
    return _norm_bytes(workload, traits) // (2 + traits.post_norms)


def _frozen_first_layer_bytes_per_token(workload: Workload) -> int:
    """Per token, what the first layer does not keep when the embedding is frozen (LoRA): nothing
    upstream needs a gradient, so its first norm keeps nothing, nor do dropouts on that norm's
    output keep masks (their dropped copies feed LoRA's A, which keeps them). Without an adapted
    attention input, the attention keeps nothing either."""
    if workload.traits.base_trains:
        return 0
    shape = workload.shape
    traits = family_traits(shape)
    attention_inputs = _adapted_modules(workload) & ATTENTION_INPUTS
    frozen = 4 * shape.hidden_size if traits.pre_norm else 0
    if not attention_inputs:
        return frozen + _attention_bytes(workload, traits)
    if workload.lora_dropout > 0:
        frozen += dropout_mask_bytes(workload) * shape.hidden_size * len(attention_inputs)
    return frozen


def _recompute_transient_per_token(workload: Workload) -> int:
    """Per token, beside a layer's saved activations while checkpointing recomputes its forward (at
    the down projection): the gradient from above and its cast, the residual stream and the
    down projection's output, and the MLP's input and product where the layer does not keep them.
    A layer that norms its MLP's output (OLMo 2, Gemma 2 and 3) starts its backward with that norm's:
    its fp32 temporaries and the gradient from above, when they are more."""
    shape, e = workload.shape, workload.param_bytes
    h = shape.hidden_size
    traits = family_traits(shape)
    if not traits.pre_norm or traits.post_norms:
        post_norm = NORM_BACKWARD_BYTES_PER_UNIT * h + e * h
        return max(post_norm, _pre_norm_recompute_transient_per_token(workload))
    return _pre_norm_recompute_transient_per_token(workload)


def _pre_norm_recompute_transient_per_token(workload: Workload) -> int:
    shape, e = workload.shape, workload.param_bytes
    h, inter = shape.hidden_size, shape.intermediate_size
    adapted = _adapted_modules(workload)
    keeps_inputs = workload.traits.base_trains or workload.lora_dropout == 0
    keeps_mlp_input = keeps_inputs and (workload.traits.base_trains or bool(adapted & (MLP_INPUTS | {"router"})))
    keeps_product = shape.num_experts > 1 or (keeps_inputs and (workload.traits.base_trains or "down_proj" in adapted))
    return e * (4 * h + (0 if keeps_mlp_input else h) + (0 if keeps_product else inter))


def _down_input_bytes_per_token(workload: Workload) -> int:
    """What a dense layer keeps for its down projection's input: the product (trained weight, or
    LoRA without dropout), or LoRA's dropped copy and mask."""
    shape, e = workload.shape, workload.param_bytes
    if workload.traits.base_trains:
        return e * shape.intermediate_size
    if not any(a.group.name == "down_proj" and a.group.part == "decoder" for a in workload.adapted):
        return 0
    mask = dropout_mask_bytes(workload) if workload.lora_dropout > 0 else 0
    return (e + mask) * shape.intermediate_size


def _backward_peak_bytes(workload: Workload, tokens: int) -> int:
    """Beside a layer's saved activations, at the peak of its backward: where a large weight
    gradient is whole (before DeepSpeed takes it), that gradient and the gradients flowing
    through the matmul producing it.

    - dense layers: the backward of the MLP's product, where the gradients of the product and of
      both its factors are alive and the down projection's saved input is freed; in full
      fine-tuning also the largest layer weight's gradient with the gradients of its input and
      output, whichever is larger;
    - full fine-tuning, fused experts: the gate-up experts' gradient, which comes once the down
      side of the experts (its output, the product, the activation, the gate-up output) is freed;
    - LoRA on fused experts: the gradient of the materialised `W + B·A`, the down projection's
      first (the gate-up's comes once the down's materialised weight is freed: the difference);
      frozen experts: the backward of each routed expert's product, as in a dense MLP (gpt-oss's
      clamped gate doubles the element-wise gradients alive at once).

    """
    shape, e = workload.shape, workload.param_bytes
    h, inter, routed = shape.hidden_size, shape.intermediate_size, shape.experts_per_token
    experts = {g.name: g.experts * g.in_features * g.out_features for g in shape.groups if g.kind == "experts"}
    if workload.traits.base_trains and experts:
        return e * experts["gate_up_proj"] + e * tokens * (h - 2 * routed * inter)
    if not experts:
        product_backward = (e * (3 * inter + h) - _down_input_bytes_per_token(workload)) * tokens
        if not workload.traits.base_trains:
            return product_backward
        largest = max(
            g.in_features * g.out_features
            for g in shape.groups
            if g.kind in ("linear", "router") and g.part == "decoder"
        )
        return max(e * largest + e * tokens * (inter + h), product_backward)
    if materialised_expert_bytes_per_layer(workload) == 0:  # frozen experts: their product's backward
        gradients = 6 if family_traits(shape).clamped_experts else 3  # gpt-oss: the clamped gate's as well
        return e * tokens * (gradients * routed * inter + h - routed * h)
    down = experts["down_proj"]
    return e * max(down, experts["gate_up_proj"] - down) + e * tokens * routed * (inter + h)


def activation_bytes(workload: Workload, micro_batch: int, checkpointing: bool) -> ActivationBytes:
    """Activation and logits bytes at the backward peak for `micro_batch` sequences.

    The peak is either the loss (every layer's activations, or with checkpointing every layer's
    input, plus the final norm and the loss chunk) or the backward of a layer (with checkpointing:
    its recomputed activations and their transients; without: the largest weight gradient)."""
    shape = workload.shape
    # a preference pair is two sequences, chosen and rejected, through one forward; the reference's
    # forward (DPO) runs before it without keeping activations, so it adds no term at this peak
    sequences = micro_batch * workload.sequences_per_step_example
    tokens = sequences * workload.seq_len
    e, h = workload.param_bytes, shape.hidden_size
    layer = layer_bytes_per_token(workload) * tokens + materialised_expert_bytes_per_layer(workload)
    shared = _shared_bytes_per_token(workload, checkpointing) * tokens + packed_mask_bytes(workload, sequences)
    logits = loss_bytes(workload, tokens)
    final_norm = _final_norm_bytes_per_token(workload) * tokens
    # the loss, or (many tokens, small chunk) the final norm's backward and its fp32 temporaries
    at_loss = final_norm + max(logits, NORM_BACKWARD_BYTES_PER_UNIT * h * tokens)
    in_backward = _backward_peak_bytes(workload, tokens)
    if checkpointing:
        kept = shape.num_layers * e * h * tokens
        recompute = layer + max(_recompute_transient_per_token(workload) * tokens, in_backward)
        return ActivationBytes(int(kept + shared + max(at_loss, recompute) - logits), logits)
    layers = shape.num_layers * layer - _frozen_first_layer_bytes_per_token(workload) * tokens
    return ActivationBytes(int(layers + shared + max(at_loss, in_backward) - logits), logits)
