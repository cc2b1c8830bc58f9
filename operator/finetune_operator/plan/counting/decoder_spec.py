"""How one decoder family lays out its weights, as data the closed-form counter reads.

Most decoder-only families in transformers are the same few pieces with different switches:
an attention (separate q/k/v projections, one fused projection, or DeepSeek's low-rank
MLA), a gated or plain MLP or a mixture of experts in some of the layers, a number of norms,
and an embedding whose output head may be tied to it. A `FamilySpec` says which pieces a
family uses, which config keys switch its optional parts (biases, q/k norms, shared
experts) and what the family does when the key is absent. `decoder_layout.py` turns a spec
and a config.json into weight groups; `families.py` holds the spec of every family the
planner counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from finetune_operator.plan.counting.config_keys import ConfigView


@dataclass(frozen=True)
class Switch:
    """An optional part, on when config key `key` is true (`default` when absent); `key=None`: always
    `default`."""

    key: str | None
    default: bool = False

    def read(self, config: ConfigView) -> bool:
        return self.default if self.key is None else config.flag(self.key, self.default)


ON = Switch(None, True)
OFF = Switch(None, False)


def key(name: str, default: bool = False) -> Switch:
    return Switch(name, default)


SizeRule = Callable[[ConfigView], int]


@dataclass(frozen=True)
class AttentionSpec:
    """The attention block's projections.

    `layout`: `separate` (q, k, v and o projections), `fused` (one q+k+v projection named
    `fused_name`), or `mla` (DeepSeek-V2/V3: low-rank query and key-value projections).
    `head_dim`: `config` reads `head_dim` when the config has it (else hidden/heads), as
    transformers' `getattr(config, "head_dim", ...)` does; `derived` always divides.
    `qk_norm`: `head` (one norm over the head dimension for q and one for k), `projection`
    (over the whole q and k projections, OLMo 2), `hidden` (OLMoE: q over hidden_size, k over
    its grouped share), or `none`; `qk_norm_on` switches it.
    """

    layout: str = "separate"
    qkv_bias: Switch = field(default_factory=lambda: key("attention_bias"))
    o_bias: Switch = field(default_factory=lambda: key("attention_bias"))
    head_dim: str = "config"
    qk_norm: str = "none"
    qk_norm_on: Switch = ON
    qk_norm_params: int = 1
    """1 for an RMSNorm's weight, 2 for a LayerNorm's weight and bias."""
    fused_name: str = "qkv_proj"
    output_name: str = "o_proj"
    output_from_hidden: bool = False
    """The output projection reads `hidden_size` features, not heads × head_dim (StableLM, Helium)."""
    sinks: bool = False
    """A learned per-head attention sink (gpt-oss)."""
    extra_per_head_dim: int = 0
    """Parameters of the size of one head the attention module owns (DiffLlama's four lambdas)."""


@dataclass(frozen=True)
class MlpSpec:
    """A dense MLP: `gated` (gate, up, down), `fused` (gate_up, down) or `plain` (up, down)."""

    layout: str = "gated"
    names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
    bias: Switch = field(default_factory=lambda: key("mlp_bias"))
    intermediate: str = "intermediate_size"


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts block and which layers have it.

    `layers`: `all`; `sparse_step` (Qwen: every `decoder_sparse_step`-th layer that is not in
    `mlp_only_layers`); `first_k_dense` (DeepSeek, GLM: dense before `first_k_dense_replace`);
    `ernie` (`moe_layer_start_index` to `moe_layer_end_index`, every
    `moe_layer_interval`-th). A config's `mlp_layer_types` list wins over any of them.
    `peft_fusion`: how peft (0.21, with transformers 5) re-targets an MoE model whose experts
    transformers fused: `qwen2_moe` (gate_proj, up_proj, down_proj and the router `gate` become
    the fused expert parameters and the router's weight), `mixtral` (w1, w3, w2, gate), or
    `None` (the experts are not adapted).
    """

    layers: str = "all"
    expert_intermediate: str = "moe_intermediate_size"
    router_name: str = "gate"
    router_bias: Switch = OFF
    router_is_linear: bool = False
    router_extra: int = 0
    """Parameters per expert the router owns beside its weight (a score correction bias)."""
    expert_bias: bool = False
    shared_size: SizeRule | None = None
    """Shared experts' width (0: none); they are gated MLPs with the family's MLP bias."""
    shared_gate: bool = False
    """A one-output linear gating the shared expert (Qwen2-MoE's `shared_expert_gate`)."""
    peft_fusion: str | None = "qwen2_moe"


@dataclass(frozen=True)
class Extra:
    """Per-layer parameters outside the linear layers and norms, e.g. BitNet's sub-norms."""

    name: str
    size: SizeRule


@dataclass(frozen=True)
class FamilySpec:
    """Everything the closed-form counter needs to know about one `model_type`."""

    attention: AttentionSpec = field(default_factory=AttentionSpec)
    mlp: MlpSpec = field(default_factory=MlpSpec)
    moe: MoeSpec | None = None
    layer_norms: int = 2
    norm_params: int = 1
    """Parameters per unit of a norm: 1 (RMSNorm), 2 (LayerNorm with bias), 0 (no affine)."""
    final_norm: bool = True
    tie: Switch = field(default_factory=lambda: key("tie_word_embeddings"))
    head_bias: Switch = OFF
    extras: tuple[Extra, ...] = ()
    activation_family: str = "llama"
    """Whose activation inventory (`activation_traits.FAMILY_TRAITS`) the family follows."""
