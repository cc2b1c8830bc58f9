"""The one description of how a run shards, offloads and batches.

The planner enumerates and chooses `Strategy` values, `status.plan` carries the chosen one's
fields (beside what the plan measured), and the trainer records the strategy it ran with every
checkpoint, so a resume under a re-plan knows what changed. Its text form (`str(strategy)`)
is the one every message, table and log line shows.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field

from .base import ApiModel

OFFLOAD_PATTERN = r"^(none|cpu|nvme)$"


class StrategyFields(ApiModel):
    """The six choices of a strategy, as `Strategy` and `status.plan` (`PlanStatus`) both carry them."""

    zero_stage: Annotated[int, Field(ge=0, le=3)]
    offload_optimizer: Annotated[str, Field(pattern=OFFLOAD_PATTERN)] = "none"
    offload_params: Annotated[str, Field(pattern=OFFLOAD_PATTERN)] = "none"
    gradient_checkpointing: bool = False
    micro_batch_size: Annotated[int, Field(ge=1)]
    gradient_accumulation_steps: Annotated[int, Field(ge=1)]

    def strategy_fields(self) -> dict[str, Any]:
        """The six choices by field name, to build the other kind from."""
        return {name: getattr(self, name) for name in StrategyFields.model_fields}


class Strategy(StrategyFields):
    """What DeepSpeed shards or offloads and the batch shape; `world_size` is set once the ranks are
    known (the trainer's, and a checkpoint's record of it) and unset in a plan, which is for the
    job's own ranks. Checkpoints recorded before `gradientCheckpointing` was kept still parse."""

    world_size: Annotated[int, Field(ge=1)] | None = None

    CHECKPOINT_FIELDS: ClassVar[tuple[str, ...]] = (
        "zero_stage",
        "offload_optimizer",
        "offload_params",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "world_size",
    )
    """What a checkpoint's layout and data position depend on (checkpointing only trades compute for memory)."""

    @classmethod
    def from_plan(cls, plan: StrategyFields, world_size: int | None = None) -> Strategy:
        """The strategy `status.plan` chose, run on `world_size` ranks (None: not yet placed)."""
        return cls(**plan.strategy_fields(), world_size=world_size)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step (per rank where the world size is unset)."""
        return self.micro_batch_size * self.gradient_accumulation_steps * (self.world_size or 1)

    def __str__(self) -> str:
        """`ZeRO-3, optimizer offload cpu, micro-batch 2 x accumulation 2 x world 2, gradient checkpointing`:
        offload, the world size and checkpointing only where there are."""
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"optimizer offload {self.offload_optimizer}")
        if self.offload_params != "none":
            parts.append(f"parameter offload {self.offload_params}")
        batch = f"micro-batch {self.micro_batch_size} x accumulation {self.gradient_accumulation_steps}"
        parts.append(batch if self.world_size is None else f"{batch} x world {self.world_size}")
        if self.gradient_checkpointing:
            parts.append("gradient checkpointing")
        return ", ".join(parts)

    def changes(self, now: Strategy) -> list[str]:
        """`field: old -> new` (wire names) for each checkpoint field that differs in `now`."""
        old, new = self.to_wire(), now.to_wire()
        keys = sorted(Strategy.model_fields[name].alias or name for name in self.CHECKPOINT_FIELDS)
        return [f"{key}: {old.get(key)} -> {new.get(key)}" for key in keys if old.get(key) != new.get(key)]
