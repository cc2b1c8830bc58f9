"""What the GPU acceptance feeds each case, and what it reports of its speed.

Why a module of its own: the acceptance must train on what the trainer trains on. Its first GPU
run fed all-ones masks of one length, which exercise neither the padded rows of a micro-batch
above 1 nor the packed rows with their block-diagonal mask (the masks SDPA sees in real jobs).
`real_batch` builds rows the way the trainer's data path does (`batching.unpacked` or
`batching.pack`, then `batching.collate`), from random token ids with a prompt part that carries
no labels. `flops_per_token` and `peak_flops` turn a measured tokens/s into model FLOPs
utilisation (MFU), the usual yardstick of how well a step uses the card.
"""

from __future__ import annotations

import random
from typing import Any

PEAK_BF16_DENSE = {  # TFLOP/s, dense bf16 tensor cores (the vendors' data sheets; SXM parts)
    "H200": 989.4,
    "H100": 989.4,
    "H800": 989.4,
    "GH200": 989.4,
    "B200": 2250.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10G": 70.0,
}


def real_batch(vocab: int, seq: int, micro: int, packed: bool, seed: int = 0) -> dict[str, Any]:
    """One micro-batch as `batching.collate` builds it: `micro` rows, each right-padded to the
    widest (one row is `seq` long), or packed from several shorter samples each."""
    from finetune_trainer.data.batching import collate, pack, unpacked
    from finetune_trainer.data.formats import IGNORE_INDEX, Sample

    rng = random.Random(seed)

    def sample(length: int) -> Sample:
        ids = tuple(rng.randrange(3, vocab) for _ in range(length))
        prompt = length // 3  # the prompt is context, not a target
        return Sample(ids, (IGNORE_INDEX,) * prompt + ids[prompt:])

    if packed:
        samples = [sample(rng.randint(max(2, seq // 8), max(2, seq // 3))) for _ in range(micro * 8)]
        rows = pack(samples, seq)[:micro]
    else:
        lengths = [seq] + [rng.randint(max(2, seq // 2), seq) for _ in range(micro - 1)]
        rows = unpacked([sample(length) for length in lengths])
    return collate(rows, pad_id=0)


def parameter_count(module: Any) -> int:
    """Every parameter of the model, whole: ZeRO-3's partitioned ones by their full size, and
    bitsandbytes' packed 4-bit ones by the shape they stand for."""
    total = 0
    for param in module.parameters():
        quant_state = getattr(param, "quant_state", None)
        if quant_state is not None and getattr(quant_state, "shape", None) is not None:
            numel = 1
            for dim in quant_state.shape:
                numel *= int(dim)
            total += numel
        else:
            total += int(getattr(param, "ds_numel", 0) or param.numel())
    return total


def flops_per_token(params: int, layers: int, hidden: int, seq: int, base_trains: bool) -> float:
    """Model FLOPs of one trained token: 2N plus causal attention's 4·L·d·s forward (PaLM's
    accounting), times 3 with the weights' gradients (full fine-tuning) or 2 without (LoRA and
    QLoRA compute only the activations' gradients through the frozen base). Recomputation under
    gradient checkpointing is not model FLOPs and is not counted."""
    forward = 2.0 * params + 4.0 * layers * hidden * seq
    return (3.0 if base_trains else 2.0) * forward


def peak_flops(device_name: str) -> float | None:
    """The card's dense bf16 peak in FLOP/s, from its name; None for a card not in the table."""
    name = f" {device_name.upper()}"
    for key in sorted(PEAK_BF16_DENSE, key=len, reverse=True):  # GH200 before H200, L40S before L4
        if f" {key}" in name:
            return PEAK_BF16_DENSE[key] * 1e12
    return None
