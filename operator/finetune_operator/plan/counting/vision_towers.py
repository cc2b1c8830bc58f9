"""Image-text models whose causal-LM class carries a vision tower beside the decoder.

`google/gemma-3-4b-pt` and its larger siblings are `gemma3` models: the trainer's
`AutoModelForCausalLM` builds `Gemma3ForConditionalGeneration`, a Gemma 3 text decoder plus
a SigLIP vision encoder and a projector. Text fine-tuning never runs the tower, but its
weights are loaded, held and (under ZeRO-3) sharded like any other, and peft's
`all-linear` adapts its linear layers too, so the planner counts them. The activation model
sees only the decoder (`WeightGroup.part`).
"""

from __future__ import annotations

from dataclasses import replace

from finetune_operator.plan.counting.config_keys import ConfigView
from finetune_operator.plan.counting.decoder_layout import DecoderLayout, decoder_layout
from finetune_operator.plan.counting.decoder_spec import FamilySpec, Switch
from finetune_operator.plan.counting.weight_groups import WeightGroup, linear


def siglip_groups(vision: ConfigView) -> list[WeightGroup]:
    """SigLIP's vision encoder: a patch convolution, learned positions, pre-norm encoder layers with
    biased projections and LayerNorms, a final LayerNorm and, when `vision_use_head`, an attention
    pooling head."""
    h, inter = vision.size("hidden_size"), vision.size("intermediate_size")
    layers = vision.size("num_hidden_layers")
    channels, patch = vision.size("num_channels"), vision.size("patch_size")
    positions = (vision.size("image_size") // patch) ** 2
    groups = [
        WeightGroup("patch_embedding", "other", channels * patch * patch, h, 1, bias=True),
        WeightGroup("position_embedding", "embedding", positions, h, 1),
        *(linear(name, h, h, layers, bias=True) for name in ("q_proj", "k_proj", "v_proj", "out_proj")),
        linear("fc1", h, inter, layers, bias=True),
        linear("fc2", inter, h, layers, bias=True),
        WeightGroup("layer_norm", "norm", 2, h, 2 * layers + 1),
    ]
    if vision.flag("vision_use_head", True):
        groups += [
            WeightGroup("probe", "other", 1, h, 1),
            WeightGroup("in_proj", "other", h, 3 * h, 1, bias=True),  # nn.MultiheadAttention's own weight
            linear("out_proj", h, h, 1, bias=True),
            WeightGroup("head_layernorm", "norm", 2, h, 1),
            linear("fc1", h, inter, 1, bias=True),
            linear("fc2", inter, h, 1, bias=True),
        ]
    return [replace(group, part="vision") for group in groups]


SIGLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_channels": 3,
    "patch_size": 16,
    "image_size": 224,
}
"""SiglipVisionConfig's defaults for the sizes."""


def gemma3_layout(config: ConfigView, text_spec: FamilySpec) -> DecoderLayout:
    """Gemma 3 with its vision tower: the text decoder from `text_config` (its output head tied
    as the top-level `tie_word_embeddings` says), SigLIP, and the projector from the tower's
    width to the decoder's."""
    text = config.sub("text_config", "gemma3_text")
    tied = config.flag("tie_word_embeddings", True)
    layout = decoder_layout(replace(text_spec, tie=Switch(None, tied)), text)
    given_vision = config.sub("vision_config", "siglip_vision_model")
    vision = ConfigView(SIGLIP_DEFAULTS | {k: v for k, v in given_vision.raw.items() if v is not None}, "siglip")
    vision_width = vision.size("hidden_size")
    projector = [
        WeightGroup("mm_input_projection", "other", vision_width, layout.dims.hidden, 1, part="vision"),
        WeightGroup("mm_soft_emb_norm", "norm", 1, vision_width, 1, part="vision"),
    ]
    return replace(layout, groups=[*layout.groups, *siglip_groups(vision), *projector])
