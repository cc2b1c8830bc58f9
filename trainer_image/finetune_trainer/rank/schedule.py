"""Learning-rate multipliers: linear warmup, then cosine, linear or constant decay.

A plain function of the step (no state beyond the step counter) so that the scheduler
state DeepSpeed checkpoints is enough to resume it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_lambda(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate for 0-based optimizer step `step`."""

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier
