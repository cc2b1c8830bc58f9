"""The embedded demo's datasets: built-in tasks that need no hub.

`builtin://reverse-words` is an instruction dataset (alpaca layout) asking to reverse a
short list of words: easy enough for the tiny model to learn visibly within minutes on
CPU, and checkable by exact match. `builtin://secret-code` is a made-up word-for-word
code that no pretrained model knows, so a real model scores 0 on it before fine-tuning.
`builtin://secret-code-preference` is the same code as preference pairs (conversational,
`dataset.format: preference`): chosen is the right answer, rejected a plausible wrong one (one
word coded with another word's code), so a model that has not learnt the code prefers either
about half the time.
Everything is a pure function of the seed, so every rank of every pod builds the same bytes.
"""

from __future__ import annotations

import random
from typing import Any

from finetune_operator.api.storage_uri import BUILTIN_DATASETS

REVERSE_WORDS = "reverse-words"
SECRET_CODE = "secret-code"
SECRET_CODE_PREFERENCE = "secret-code-preference"
DATASETS = BUILTIN_DATASETS
WORDS = [
    "red",
    "blue",
    "green",
    "black",
    "white",
    "gold",
    "pink",
    "gray",
    "cat",
    "dog",
    "fox",
    "owl",
    "bee",
    "ant",
    "cow",
    "pig",
    "sun",
    "moon",
    "star",
    "rain",
    "snow",
    "wind",
    "fire",
    "ice",
    "one",
    "two",
    "six",
    "ten",
    "big",
    "old",
    "new",
    "hot",
]
"""Distinct words; the tokenizer learns each as one token, so answers are short."""

INSTRUCTION = "Reverse the order of the words."
DEFAULT_DATASET_SIZE = 4000

CODE_WORDS = [
    "apple",
    "tiger",
    "river",
    "stone",
    "cloud",
    "lemon",
    "piano",
    "candle",
    "horse",
    "tower",
    "mirror",
    "basket",
    "rocket",
    "garden",
    "silver",
    "forest",
]
"""The code alphabet of `builtin://secret-code`: ordinary words (one token each for a real
tokenizer), assigned to the first 16 `WORDS` by a fixed shuffle, so the answer is unguessable
but learnable in a few dozen CPU steps."""

SECRET_CODE_SYSTEM = "Answer in the secret code."


def reverse_words_records(count: int = DEFAULT_DATASET_SIZE, seed: int = 1234) -> list[dict[str, Any]]:
    """Records readable as `alpaca` and as `messages`: 3 to 5 words, answered in reverse order."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for _ in range(count):
        words = rng.choices(WORDS, k=rng.randint(3, 5))
        text, answer = " ".join(words), " ".join(reversed(words))
        records.append(
            {
                "instruction": INSTRUCTION,
                "input": text,
                "output": answer,
                "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}],
            }
        )
    return records


def secret_code() -> dict[str, str]:
    """The fixed word → code word table (the same for every seed: the task, not the sample)."""
    codes = list(CODE_WORDS)
    random.Random(16).shuffle(codes)
    return dict(zip(WORDS[: len(codes)], codes, strict=True))


def secret_code_records(count: int = DEFAULT_DATASET_SIZE, seed: int = 1234) -> list[dict[str, Any]]:
    """Records readable as `alpaca` and as `messages`: 2 to 3 words, answered word for word in code."""
    rng = random.Random(seed)
    table = secret_code()
    records: list[dict[str, Any]] = []
    for _ in range(count):
        words = rng.choices(sorted(table), k=rng.randint(2, 3))
        text, answer = " ".join(words), " ".join(table[w] for w in words)
        records.append(
            {
                "instruction": SECRET_CODE_SYSTEM,
                "input": text,
                "output": answer,
                "messages": [
                    {"role": "system", "content": SECRET_CODE_SYSTEM},
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": answer},
                ],
            }
        )
    return records


def secret_code_preference_records(count: int = DEFAULT_DATASET_SIZE, seed: int = 1234) -> list[dict[str, Any]]:
    """Preference pairs (TRL's conversational form): the secret-code prompt, the right answer as
    chosen, and as rejected the same answer with one word coded wrongly (another word's code)."""
    rng = random.Random(seed)
    table = secret_code()
    codes = sorted(table.values())
    records: list[dict[str, Any]] = []
    for _ in range(count):
        words = rng.choices(sorted(table), k=rng.randint(2, 3))
        right = [table[w] for w in words]
        wrong = list(right)
        slot = rng.randrange(len(wrong))
        wrong[slot] = rng.choice([c for c in codes if c != right[slot]])
        prompt = [{"role": "system", "content": SECRET_CODE_SYSTEM}, {"role": "user", "content": " ".join(words)}]
        records.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": " ".join(right)}],
                "rejected": [{"role": "assistant", "content": " ".join(wrong)}],
            }
        )
    return records


def builtin_records(name: str, seed: int = 1234) -> list[dict[str, Any]]:
    if name == SECRET_CODE_PREFERENCE:
        return secret_code_preference_records(seed=seed)
    if name == REVERSE_WORDS:
        return list(reverse_words_records(seed=seed))
    if name == SECRET_CODE:
        return secret_code_records(seed=seed)
    raise FileNotFoundError(f"builtin://{name}: unknown built-in dataset (known: {', '.join(DATASETS)})")
