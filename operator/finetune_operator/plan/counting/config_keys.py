"""Reading a config.json the way transformers reads it, without transformers.

A published config.json and the one today's transformers writes name some fields differently
(`num_experts` and `num_local_experts`, `n_embd` and `hidden_size`), leave fields out when
the model class has a default for them, and keep values the class ignores. `ConfigView`
answers the counter's questions (a size, a switch, a list) with the first key present among
the names transformers accepts, the family's default when none is, and a message naming the
key when a value is not what the planner can count with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.plan.counting.family_defaults import FAMILY_DEFAULTS
from finetune_operator.plan.errors import UnknownArchitectureError

ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_topk", "moe_k", "top_k"),
}
"""The names transformers' configuration classes accept for one field (their `attribute_map`)."""


@dataclass(frozen=True)
class ConfigView:
    """A config.json mapping, read with transformers' aliases and the configuration class's defaults.

    A key the config sets, even to null, is the config's; a key it leaves out is the class's default
    (`defaults`), if the class declares one."""

    raw: dict[str, Any]
    model_type: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def _first(self, key: str) -> tuple[str, Any]:
        names = ALIASES.get(key, (key,))
        for source in (self.raw, self.defaults):
            for name in names:
                if name in source:
                    return name, source[name]
        return key, None

    def value(self, key: str) -> Any:
        """The raw value the config (or, when it leaves the key out, the class's default) gives `key`."""
        return self._first(key)[1]

    def has(self, key: str) -> bool:
        return self._first(key)[1] is not None

    def size(self, key: str, default: int | None = None) -> int:
        """A positive whole number (a width, a count); missing without a default is an error."""
        name, value = self._first(key)
        if value is None:
            if default is None:
                raise UnknownArchitectureError(
                    f"config.json of this {self.model_type} model has no {key!r}, which the planner needs to count "
                    "its parameters"
                )
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**40:
            raise UnknownArchitectureError(
                f"config.json {name!r} of this {self.model_type} model is {value!r}: the planner needs a positive "
                "whole number"
            )
        return value

    def count(self, key: str, default: int = 0) -> int:
        """A whole number that may be zero (shared experts, dense layers before the first MoE layer)."""
        name, value = self._first(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**40:
            raise UnknownArchitectureError(
                f"config.json {name!r} of this {self.model_type} model is {value!r}: the planner needs a whole number"
            )
        return value

    def optional_size(self, key: str) -> int | None:
        """A positive whole number, or None where the key is missing or null (a feature turned off)."""
        return self.size(key) if self.has(key) else None

    def flag(self, key: str, default: bool) -> bool:
        value = self._first(key)[1]
        return default if value is None else bool(value)

    def number_list(self, key: str) -> list[int] | None:
        name, value = self._first(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise UnknownArchitectureError(
                f"config.json {name!r} of this {self.model_type} model is {value!r}: the planner needs a list of "
                "numbers"
            )
        return value

    def word_list(self, key: str, allowed: Sequence[str], layers: int) -> list[str] | None:
        """A per-layer list of kinds (`layer_types`, `mlp_layer_types`), checked against `allowed`."""
        name, value = self._first(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != layers or not all(v in allowed for v in value):
            raise UnknownArchitectureError(
                f"config.json {name!r} of this {self.model_type} model must list one of {sorted(allowed)} for each "
                f"of the {layers} layers, not {value!r}"
            )
        return [str(v) for v in value]

    def sub(self, key: str, model_type: str) -> ConfigView:
        """A nested configuration (`text_config`, `vision_config`) as a view of its own."""
        value = self.raw.get(key)
        if not isinstance(value, dict):
            raise UnknownArchitectureError(f"config.json of this {self.model_type} model has no {key!r} object")
        kind = str(value.get("model_type") or model_type)
        return ConfigView(value, kind, FAMILY_DEFAULTS.get(kind, {}))
