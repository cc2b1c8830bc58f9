"""`dataset.format: preference`: rows {"prompt", "chosen", "rejected"} in TRL's standard (strings)
and conversational (messages) forms, the prompt taken as TRL takes it when implicit, only the
answers scored, and a broken row named the way SFT's are."""

from __future__ import annotations

from typing import Any

import pytest
from trl.data_utils import extract_prompt

from finetune_trainer.data.formats import (
    IGNORE_INDEX,
    MalformedRecord,
    preference_parts,
    tokenize_preference,
)
from finetune_trainer.model.builtin_models import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(512)


def answer_text(tokenizer: Any, ids: tuple[int, ...], labels: tuple[int, ...]) -> str:
    return str(tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]))


def test_a_standard_row_scores_only_the_answers_after_one_shared_prompt(tokenizer: Any) -> None:
    pair = tokenize_preference(
        {"prompt": "red blue green", "chosen": "green blue red", "rejected": "blue red green"}, tokenizer, 64
    )
    assert pair is not None
    prompt_len = pair.chosen.labels.index(next(x for x in pair.chosen.labels if x != IGNORE_INDEX))
    assert pair.chosen.input_ids[:prompt_len] == pair.rejected.input_ids[:prompt_len]
    assert answer_text(tokenizer, pair.chosen.input_ids, pair.chosen.labels).startswith("green blue red")
    assert answer_text(tokenizer, pair.rejected.input_ids, pair.rejected.labels).startswith("blue red green")
    assert pair.chosen.input_ids[-1] == tokenizer.eos_token_id  # the answer ends, as in SFT


def test_a_conversational_row_applies_the_chat_template_and_scores_the_assistant_turn(tokenizer: Any) -> None:
    prompt = [{"role": "user", "content": "red blue"}]
    pair = tokenize_preference(
        {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": "blue red"}],
            "rejected": [{"role": "assistant", "content": "red blue"}],
        },
        tokenizer,
        64,
    )
    assert pair is not None
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": "blue red"}], tokenize=False)
    # prompt and answer are tokenised apart (as TRL's DPO does), the answer's labels kept
    prompt_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(full[len(prefix) :], add_special_tokens=False)["input_ids"]
    assert pair.chosen.input_ids == tuple(prompt_ids + answer_ids)
    assert pair.chosen.labels == tuple([IGNORE_INDEX] * len(prompt_ids) + answer_ids)
    assert "blue red" in answer_text(tokenizer, pair.chosen.input_ids, pair.chosen.labels)
    assert "user" not in answer_text(tokenizer, pair.chosen.input_ids, pair.chosen.labels)


@pytest.mark.parametrize(
    "row",
    [
        {"chosen": "Q: sky? A: It is blue.", "rejected": "Q: sky? A: It is green."},
        {"chosen": "The sky is blue", "rejected": "The sky is green"},
        {
            "chosen": [{"role": "user", "content": "sky?"}, {"role": "assistant", "content": "blue"}],
            "rejected": [{"role": "user", "content": "sky?"}, {"role": "assistant", "content": "green"}],
        },
        {
            "chosen": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "sky?"},
                {"role": "assistant", "content": "blue"},
            ],
            "rejected": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "sky?"},
                {"role": "assistant", "content": "green"},
            ],
        },
    ],
)
def test_an_implicit_prompt_is_taken_as_trl_takes_it(row: dict[str, Any]) -> None:
    ours = preference_parts(row)
    theirs = extract_prompt(row)
    assert ours == (theirs["prompt"], theirs["chosen"], theirs["rejected"])


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "p", "rejected": "r"}, "missing field 'chosen'"),
        ({"prompt": "p", "chosen": 3, "rejected": "r"}, "field 'chosen' must be a string or a list of messages"),
        (
            {"prompt": "p", "chosen": "c", "rejected": [{"role": "assistant", "content": "r"}]},
            "must both be strings or both lists",
        ),
        ({"prompt": 5, "chosen": "c", "rejected": "r"}, "field 'prompt' must be a string"),
        ({"chosen": "abc", "rejected": "xyz"}, "share no prompt"),
        ({"chosen": "same", "rejected": "same"}, "do not differ"),
        ({"prompt": [{"role": "user"}], "chosen": [], "rejected": []}, "'chosen' must be a non-empty"),
        (
            {
                "prompt": [{"role": "robot", "content": "x"}],
                "chosen": [{"role": "assistant", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            },
            "prompt[0]: unknown role 'robot'",
        ),
    ],
)
def test_a_broken_row_says_which_field(row: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedRecord, match=message.replace("[", r"\[").replace("]", r"\]")):
        preference_parts(row)


def test_a_prompt_that_fills_the_length_leaves_no_pair(tokenizer: Any) -> None:
    row = {"prompt": " ".join(["red"] * 40), "chosen": "blue", "rejected": "green"}
    assert tokenize_preference(row, tokenizer, 8) is None
    assert tokenize_preference(row, tokenizer, 256) is not None


def test_the_built_in_preference_set_pairs_the_right_code_with_one_wrong_word(tokenizer: Any) -> None:
    from finetune_trainer.data.builtin_datasets import (
        SECRET_CODE_PREFERENCE,
        builtin_records,
        secret_code,
        secret_code_preference_records,
    )

    table = secret_code()
    rows = secret_code_preference_records(200, seed=5)
    assert rows == secret_code_preference_records(200, seed=5)  # every rank builds the same bytes
    assert builtin_records(SECRET_CODE_PREFERENCE)[:3] == secret_code_preference_records(3)
    for row in rows:
        words = row["prompt"][-1]["content"].split()
        right, wrong = row["chosen"][0]["content"].split(), row["rejected"][0]["content"].split()
        assert right == [table[w] for w in words]
        assert len(wrong) == len(right) and sum(a != b for a, b in zip(right, wrong, strict=True)) == 1
        assert set(wrong) <= set(table.values())
        assert tokenize_preference(row, tokenizer, 256) is not None


def test_a_micro_batch_of_pairs_puts_every_chosen_row_first() -> None:
    """Example i of a preference set is rows 2i (chosen) and 2i+1 (rejected); a micro-batch of
    examples [3, 0] is [chosen 3, chosen 0, rejected 3, rejected 0], so `chunk(2)` splits it."""
    from finetune_trainer.data.batching import Row, example_rows

    rows = [Row((n,), (n,), (1,)) for n in range(8)]
    assert [r.input_ids[0] for r in example_rows(rows, [3, 0], 2)] == [6, 0, 7, 1]
    assert [r.input_ids[0] for r in example_rows(rows, [3, 0])] == [3, 0]  # SFT: example i is row i


def test_the_trainer_refuses_a_reference_it_does_not_train_yet(tmp_path: Any) -> None:
    """A full-model DPO with precomputed reference log-probabilities (not trained yet) stops before
    any data is read, naming the field."""
    from pathlib import Path

    import yaml

    from finetune_operator.api import FineTuneJob
    from finetune_trainer.rank.rank_setup import load_data
    from finetune_trainer.settings import ConfigError

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["method"] = {"type": "dpo", "preference": {"base": "full", "precomputeReference": True}}
    doc["spec"]["dataset"] = {"uri": "builtin://secret-code-preference", "format": "preference"}
    spec = FineTuneJob.from_wire(doc).spec
    with pytest.raises(ConfigError, match=r"method\.preference\.precomputeReference: precomputed reference"):
        load_data(spec, None, None, None, local_rank=0, cache_root=tmp_path)  # type: ignore[arg-type]
    assert not any(Path(tmp_path).iterdir())


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "red blue green", "chosen": " green blue red", "rejected": " blue red green"},
        {
            "prompt": [{"role": "system", "content": "Answer in code."}, {"role": "user", "content": "red blue"}],
            "chosen": [{"role": "assistant", "content": "blue red"}],
            "rejected": [{"role": "assistant", "content": "red blue"}],
        },
    ],
    ids=["standard", "conversational"],
)
def test_a_held_out_pair_is_generated_from_where_its_chosen_answer_starts(row: dict[str, Any], tokenizer: Any) -> None:
    """The demo's exact match on preference data: greedy decoding starts from the exact prompt tokens
    the pair's rows begin with, and its text is compared with the chosen answer."""
    from finetune_operator.api.spec import DatasetFormat
    from finetune_trainer.rank.rank_setup import exact_match_prompt

    prompt_ids, expected = exact_match_prompt(row, DatasetFormat.PREFERENCE, tokenizer)
    pair = tokenize_preference(row, tokenizer, 64)
    assert pair is not None
    first_answer = next(i for i, label in enumerate(pair.chosen.labels) if label != IGNORE_INDEX)
    assert tuple(prompt_ids) == pair.chosen.input_ids[:first_answer]
    answer = [i for i, label in zip(pair.chosen.input_ids, pair.chosen.labels, strict=True) if label != IGNORE_INDEX]
    assert expected.strip() == tokenizer.decode(answer, skip_special_tokens=True).strip()  # as exact_match decodes
