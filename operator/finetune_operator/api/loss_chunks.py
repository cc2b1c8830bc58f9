"""How the loss is computed, in numbers both the trainer and the memory model use.

The trainer never materialises the full-vocabulary logits (see `finetune_kernels.chunked_loss`): only
positions whose shifted label is trained go through the LM head, in chunks of at most
`loss_chunk_tokens(V)` tokens, each chunk upcast to fp32 on its own and recomputed in
backward. So the logits term of a plan is one chunk's worth of vocabulary entries plus
the hidden states of the trained tokens, whatever the sequence length. This module is
torch-free so the planner can import it.

Families whose head output is post-processed (logit soft-capping, logit scaling) keep the
full-logits path in the trainer, and their plan keeps the full-logits term.
"""

from __future__ import annotations

IGNORE_INDEX = -100
"""The label of a position that is not trained (prompt, padding, a packed sample's first token)."""
LOSS_CHUNK_ELEMENTS = 2**24
"""Logit entries (tokens × vocabulary) one chunk holds: 130 tokens of a 128k vocabulary."""
HIDDEN_COPIES = 2
"""Per trained token at the loss peak: the gathered hidden state and its gradient (scattering the
gradient back comes after the chunk is freed, and the gathered copy is freed by then)."""
HEAD_POSTPROCESSING_ATTRIBUTES = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config attributes whose model transforms the head's output: the trainer keeps full logits there."""


def chunk_bytes_per_logit(param_bytes: int) -> int:
    """Per logit entry of the chunk at its peak: the 16-bit matmul output and its fp32 upcast,
    alive together for a moment, in forward and again in backward (where the fp32 copy turns in
    place into the softmax gradient, cast back to 16 bits). In fp32 training the casts are no-ops."""
    return 4 + (param_bytes if param_bytes < 4 else 0)


def loss_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk of the LM head + cross entropy."""
    return max(1, LOSS_CHUNK_ELEMENTS // max(1, vocab_size))


def chunked_loss_bytes(vocab_size: int, hidden_size: int, trained_tokens: int, param_bytes: int) -> int:
    """Peak bytes of the chunked loss for `trained_tokens` positions (all tokens, when unknown)."""
    chunk = min(trained_tokens, loss_chunk_tokens(vocab_size))
    return (
        chunk_bytes_per_logit(param_bytes) * chunk * vocab_size
        + HIDDEN_COPIES * param_bytes * hidden_size * trained_tokens
    )
