"""The LoRA dropout rule, shared by the planner (from a model's config) and the trainer
(from the loaded model's parameters), so the two cannot disagree about a job."""

from __future__ import annotations

from .spec import DEFAULT_LORA_DROPOUT


class UnsupportedSetting(ValueError):
    """A setting the job's model cannot take; the message names the field and what is allowed."""


def resolve_lora_dropout(requested: float | None, fused_experts: str | None) -> float:
    """The LoRA dropout a run uses: the spec's, else the default; 0 where `all-linear` adapts fused experts.

    A mixture of experts in recent transformers stores each projection of its experts as one 3-D
    tensor, which peft adapts as a parameter (its ParamWrapper), where it has no dropout. So on
    those models an unset dropout means 0 and a non-zero one is refused. `fused_experts`
    describes those weights for the message, or is None when the targets include none.
    """
    if fused_experts is None:
        return DEFAULT_LORA_DROPOUT if requested is None else requested
    if requested:
        raise UnsupportedSetting(
            f"spec.method.lora.dropout: {requested} cannot apply to {fused_experts}: targetModules all-linear "
            "adapts them, and peft has no dropout there; leave dropout unset or set it to 0, or list "
            "targetModules without the experts (e.g. [q_proj, k_proj, v_proj, o_proj])"
        )
    return 0.0
