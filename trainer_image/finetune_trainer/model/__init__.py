"""The model a rank trains: loading it (`modeling`) and what adapts it (`lora_targets`), the loss
it trains with (`loss`), the artefacts it leaves (`export`), and the built-in demo models
(`builtin_models`, `gguf_import`).
"""
