"""Where decoder families differ in what autograd keeps, as data the activation model reads.

Most families keep what a Llama decoder keeps (`activations.py` describes that inventory);
the traits below say where one differs: norms after the sublayers, a norm that scales in
fp32, attention that keeps its scores, a fused q+k+v projection, gpt-oss's clamped experts.
`TRACED_FAMILIES` are those the traced step checks; a plan for any other counted family
says its activations rest on the inventory of the decoder it resembles.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune_operator.plan.counting.param_count import ArchitectureShape


@dataclass(frozen=True)
class FamilyActivationTraits:
    post_norms: int = 0
    """Norms after attention and MLP as well (Gemma 2): each keeps its fp32 input too."""
    fp32_norm_output: bool = False
    """The norm scales in fp32 (Gemma, OLMo 2): a trained weight's gradient needs the fp32 normalised input."""
    eager_attention: str = ""
    """The attention keeps its scores (no flash kernel): `softcapped` (Gemma 2: fp32 softmax, capped
    scores and probabilities) or `sinks` (gpt-oss: the probabilities beside a learned sink column)."""
    pre_norm: bool = True
    """Norms before attention and MLP. Post-norm families (OLMo 2) norm the sublayers' outputs, which
    need a gradient even in LoRA's first layer, so that layer's first norm keeps its input."""
    clamped_experts: bool = False
    """gpt-oss's experts: a clamped SwiGLU over an interleaved gate-up projection (see `_mlp_bytes`)."""
    fused_qkv: bool = False
    """One q+k+v projection: without grouped-query repeats, v is a view that keeps the whole output."""
    attention_output_copy: bool = False
    """The attention's output is head-major (concatenated rotary, eager matmul): a linear that keeps
    o_proj's input keeps a token-major copy of it."""


FAMILY_TRAITS: dict[str, FamilyActivationTraits] = {
    "llama": FamilyActivationTraits(),
    "mistral": FamilyActivationTraits(),
    "mixtral": FamilyActivationTraits(),
    "qwen2": FamilyActivationTraits(),
    "gemma2": FamilyActivationTraits(
        post_norms=2, fp32_norm_output=True, eager_attention="softcapped", attention_output_copy=True
    ),
    "gemma": FamilyActivationTraits(fp32_norm_output=True),
    "gemma3": FamilyActivationTraits(post_norms=2, fp32_norm_output=True),
    "phi3": FamilyActivationTraits(fused_qkv=True, attention_output_copy=True),
    "olmo2": FamilyActivationTraits(pre_norm=False, fp32_norm_output=True),
    "gpt_oss": FamilyActivationTraits(eager_attention="sinks", attention_output_copy=True, clamped_experts=True),
}


TRACED_FAMILIES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gemma3", "phi3",
     "olmo2", "granite", "gpt_oss"}
)  # fmt: skip
"""The model_types whose analytical activations `tests/unit/test_plan_traced.py` holds to the traced step
within 5 % (those of the catalogue's entries). Other counted families follow the inventory of the
decoder they resemble, unchecked; their plans say so (`activation_note`)."""


def activation_note(shape: ArchitectureShape) -> str | None:
    """A line for the plan when the family's activation estimate is not held to a traced step."""
    if shape.family in TRACED_FAMILIES:
        return None
    return (
        f"activations of {shape.family} models are estimated with a {shape.traits or shape.family} decoder's "
        "inventory, not checked against a traced step; `ftjob plan --traced` measures them"
    )


def family_traits(shape: ArchitectureShape) -> FamilyActivationTraits:
    """The activation inventory the shape's family follows (a Llama decoder's by default)."""
    return FAMILY_TRAITS.get(shape.traits or shape.family, FamilyActivationTraits())
