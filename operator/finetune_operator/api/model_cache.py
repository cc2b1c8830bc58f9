"""How large a hub model's download cache must be, from the bytes of the files a pod downloads.

The planner checks a requested `model.cache.size` against it (a too small cache is refused
before any GPU is taken, naming the size needed), and the renderer sizes each pod's cache claim
with it. The bytes come from the model's own files (the hub's listing, a claim's files) or,
for a catalogue model, from its parameter count and dtype.
"""

from __future__ import annotations

import math

from .base import quantity_bytes

DOWNLOADED_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py")
"""What a trainer pod downloads of a hub model and `from_pretrained` reads: configs, safetensors weights,
tokenizer files and the chat template (no .bin/.pth duplicates). The cache is sized to these."""
GIB = 2**30
NEEDED_SLACK = 0.05
NEEDED_EXTRA_BYTES = 1 * GIB
"""The least a cache must hold beyond the weights: download temporaries, tokenizer, file-system overhead."""
DEFAULT_SLACK = 0.20
DEFAULT_EXTRA_BYTES = 2 * GIB
"""A default cache claim's room beyond the weights (a second revision's files, the hub library's metadata)."""


def needed_bytes(model_bytes: int) -> int:
    return int(model_bytes * (1 + NEEDED_SLACK)) + NEEDED_EXTRA_BYTES


def whole_gib(size: int) -> str:
    """`size` rounded up to whole GiB, as a Kubernetes quantity."""
    return f"{max(1, math.ceil(size / GIB))}Gi"


def default_size(model_bytes: int) -> str:
    """Each pod's cache claim when `model.cache.size` is unset."""
    return whole_gib(int(model_bytes * (1 + DEFAULT_SLACK)) + DEFAULT_EXTRA_BYTES)


def too_small(size: str, model_bytes: int, model: str) -> str | None:
    """Why a requested cache `size` cannot hold the model, or None when it can."""
    if quantity_bytes(size) >= needed_bytes(model_bytes):
        return None
    return (
        f"spec.model.cache.size {size} cannot hold {model}: its files are {model_bytes / GIB:.1f} GiB "
        f"({model_bytes / 1e9:.1f} GB); set at least {whole_gib(needed_bytes(model_bytes))}, or leave size unset "
        f"for {default_size(model_bytes)}"
    )
