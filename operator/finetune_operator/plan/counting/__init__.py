"""Counting a model from its config.json, without torch: the decoder families' weight layouts
(`families`, `decoder_spec`, `decoder_layout`, `weight_groups`, `vision_towers`), the defaults a
config may leave out (`family_defaults`, `config_keys`), exact parameter counts in closed form
(`param_count`; `meta_count` checks them against the real classes on the meta device), and where
families differ in what autograd keeps (`activation_traits`).
"""
