"""Record layouts (alpaca, sharegpt, messages, text) turned into token ids and labels.

Instruction formats train only on responses: every prompt token gets the label -100.
A record is first split into text segments marked trainable or not, then each segment is
tokenised and concatenated, so the boundary between prompt and response is exact
whatever the tokenizer merges. The first token of every sample is never a target, which
is what lets packed samples sit side by side without predicting across the seam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

IGNORE_INDEX = -100
PREFERENCE = "preference"
"""`dataset.format: preference`: rows of prompt, chosen and rejected (`tokenize_preference`)."""

ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input. "
    "Write a response that completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class MalformedRecord(ValueError):
    """A record that does not have the fields its format needs (reported with file and line)."""


class Tokenizer(Protocol):
    bos_token_id: int | None
    eos_token_id: int | None

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Sample:
    """One tokenised training example."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]

    @property
    def trainable_tokens(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE_INDEX)


def _text_field(record: dict[str, Any], key: str, required: bool = True) -> str:
    value = record.get(key)
    if value is None:
        if required:
            raise MalformedRecord(f"missing field {key!r}")
        return ""
    if not isinstance(value, str):
        raise MalformedRecord(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def alpaca_prompt(record: dict[str, Any]) -> str:
    instruction = _text_field(record, "instruction")
    context = _text_field(record, "input", required=False)
    if context:
        return ALPACA_PROMPT.format(instruction=instruction, input=context)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)


def _conversation(record: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    key, role_key, text_key = (
        ("conversations", "from", "value") if fmt == "sharegpt" else ("messages", "role", "content")
    )
    turns = record.get(key)
    if not isinstance(turns, list) or not turns:
        raise MalformedRecord(f"field {key!r} must be a non-empty list")
    out: list[dict[str, str]] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise MalformedRecord(f"{key}[{index}] must be an object")
        role, text = turn.get(role_key), turn.get(text_key)
        if not isinstance(role, str) or not isinstance(text, str):
            raise MalformedRecord(f"{key}[{index}] needs string fields {role_key!r} and {text_key!r}")
        mapped = SHAREGPT_ROLES.get(role) if fmt == "sharegpt" else role
        if mapped not in ("system", "user", "assistant"):
            raise MalformedRecord(f"{key}[{index}]: unknown role {role!r}")
        out.append({"role": mapped, "content": text})
    if not any(t["role"] == "assistant" for t in out):
        raise MalformedRecord(f"{key} has no assistant turn to learn from")
    return out


def segments(record: dict[str, Any], fmt: str, tokenizer: Tokenizer) -> list[tuple[str, bool]]:
    """The record as (text, trainable) pieces, special tokens written as text."""
    bos = _special(tokenizer, "bos_token")
    eos = _special(tokenizer, "eos_token")
    if fmt == "alpaca":
        return [(bos + alpaca_prompt(record), False), (_text_field(record, "output") + eos, True)]
    if fmt == "text":
        return [(bos, False), (_text_field(record, "text") + eos, True)]
    if fmt in ("sharegpt", "messages"):
        turns = _conversation(record, fmt)
        pieces: list[tuple[str, bool]] = []
        rendered = ""
        for i, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            prefix = str(tokenizer.apply_chat_template(turns[:i], tokenize=False, add_generation_prompt=True))
            full = str(tokenizer.apply_chat_template(turns[: i + 1], tokenize=False))
            if not prefix.startswith(rendered) or not full.startswith(prefix):
                raise MalformedRecord("the tokenizer's chat template does not render turns incrementally")
            pieces.append((prefix[len(rendered) :], False))
            pieces.append((full[len(prefix) :], True))
            rendered = full
        return [p for p in pieces if p[0]]
    raise ValueError(f"unknown dataset format {fmt!r}")


def _special(tokenizer: Tokenizer, name: str) -> str:
    value = getattr(tokenizer, name, None)
    return value if isinstance(value, str) else ""


def tokenize_record(record: dict[str, Any], fmt: str, tokenizer: Tokenizer, max_len: int) -> Sample | None:
    """Token ids and labels, truncated to `max_len`; None when nothing trainable survives."""
    ids: list[int] = []
    labels: list[int] = []
    for text, trainable in segments(record, fmt, tokenizer):
        piece = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.extend(piece)
        labels.extend(piece if trainable else [IGNORE_INDEX] * len(piece))
    if not ids:
        return None
    labels[0] = IGNORE_INDEX
    ids, labels = ids[:max_len], labels[:max_len]
    sample = Sample(tuple(ids), tuple(labels))
    return sample if sample.trainable_tokens else None


def prompt_and_answer(record: dict[str, Any]) -> tuple[str, str]:
    """For exact-match evaluation of alpaca records: the prompt text and the expected output."""
    return alpaca_prompt(record), _text_field(record, "output")


@dataclass(frozen=True)
class PreferencePair:
    """One tokenised preference example: the prompt with the chosen answer, and with the rejected one
    (only the answers' tokens are labelled)."""

    chosen: Sample
    rejected: Sample


def _messages(value: Any, key: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise MalformedRecord(f"field {key!r} must be a non-empty string or list of messages")
    out: list[dict[str, str]] = []
    for index, turn in enumerate(value):
        role = turn.get("role") if isinstance(turn, dict) else None
        text = turn.get("content") if isinstance(turn, dict) else None
        if not isinstance(role, str) or not isinstance(text, str):
            raise MalformedRecord(f"{key}[{index}] needs string fields 'role' and 'content'")
        if role not in ("system", "user", "assistant"):
            raise MalformedRecord(f"{key}[{index}]: unknown role {role!r}")
        out.append({"role": role, "content": text})
    return out


def preference_parts(record: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The prompt, chosen and rejected parts of a preference row, in TRL's standard form (strings) or
    conversational form (lists of messages). Without a `prompt` field the prompt is implicit: the
    longest common prefix of chosen and rejected (messages, or characters less a space before the
    answer), as TRL's `extract_prompt` takes it."""
    chosen: Any = record.get("chosen")
    rejected: Any = record.get("rejected")
    for key, value in (("chosen", chosen), ("rejected", rejected)):
        if value is None:
            raise MalformedRecord(f"missing field {key!r}")
        if not isinstance(value, (str, list)):
            raise MalformedRecord(f"field {key!r} must be a string or a list of messages, got {type(value).__name__}")
    if type(chosen) is not type(rejected):
        raise MalformedRecord("fields 'chosen' and 'rejected' must both be strings or both lists of messages")
    conversational = isinstance(chosen, list)
    if conversational:
        chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
    if "prompt" in record:
        prompt = record["prompt"]
        if conversational:
            prompt = _messages(prompt, "prompt")
        elif not isinstance(prompt, str):
            raise MalformedRecord("field 'prompt' must be a string when 'chosen' and 'rejected' are strings")
        return prompt, chosen, rejected
    index = 0
    while index < min(len(chosen), len(rejected)) and chosen[index] == rejected[index]:
        index += 1
    if not conversational and 0 < index < min(len(chosen), len(rejected)) and chosen[index - 1] == " ":
        index -= 1  # the space before the answers stays with them
    if index == 0:
        raise MalformedRecord("no 'prompt' field, and 'chosen' and 'rejected' share no prompt to take it from")
    if index == len(chosen) or index == len(rejected):
        raise MalformedRecord("'chosen' and 'rejected' do not differ after their shared prompt")
    return chosen[:index], chosen[index:], rejected[index:]


def _preference_segments(prompt: Any, answer: Any, tokenizer: Tokenizer) -> list[tuple[str, bool]]:
    if isinstance(prompt, str):
        return [(_special(tokenizer, "bos_token") + prompt, False), (answer + _special(tokenizer, "eos_token"), True)]
    if not any(turn["role"] == "assistant" for turn in answer):
        raise MalformedRecord("a conversational answer needs an assistant turn")
    prefix = str(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
    full = str(tokenizer.apply_chat_template(prompt + answer, tokenize=False))
    if not full.startswith(prefix):
        raise MalformedRecord("the tokenizer's chat template does not render the prompt as a prefix of the answer")
    return [(prefix, False), (full[len(prefix) :], True)]


def _tokenized(pieces: list[tuple[str, bool]], tokenizer: Tokenizer, max_len: int) -> Sample:
    ids: list[int] = []
    labels: list[int] = []
    for text, trainable in pieces:
        piece = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.extend(piece)
        labels.extend(piece if trainable else [IGNORE_INDEX] * len(piece))
    if labels:
        labels[0] = IGNORE_INDEX
    return Sample(tuple(ids[:max_len]), tuple(labels[:max_len]))


def tokenize_preference(record: dict[str, Any], tokenizer: Tokenizer, max_len: int) -> PreferencePair | None:
    """The pair tokenised and truncated to `max_len` each; None when an answer has no token left
    (its prompt alone fills `max_len`)."""
    prompt, chosen, rejected = preference_parts(record)
    pair = PreferencePair(
        _tokenized(_preference_segments(prompt, chosen, tokenizer), tokenizer, max_len),
        _tokenized(_preference_segments(prompt, rejected, tokenizer), tokenizer, max_len),
    )
    return pair if pair.chosen.trainable_tokens and pair.rejected.trainable_tokens else None
