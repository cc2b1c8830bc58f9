"""The per-node data cache: one rank tokenises, the others memory-map its result (no ranks started)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from finetune_trainer.data import builtin_datasets, prepared
from finetune_trainer.data.batching import Row, pack, unpacked
from finetune_trainer.data.loading import DataError, DataUnavailable, load_samples
from finetune_trainer.data.prepared import DataSettings, cache_key, prepare, split_validation
from finetune_trainer.model import builtin_models
from tests.support.training_runs import write_jsonl

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(60)]


class CountingTokenizer:
    """The real tokenizer, counting how many texts it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        self.calls += 1
        return self.inner(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    tokenizer: PreTrainedTokenizerFast = builtin_models.build_tokenizer(512)
    return tokenizer


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    rows = [
        {k: r[k] for k in ("instruction", "input", "output")}
        for r in builtin_datasets.reverse_words_records(40, seed=3)
    ]
    return write_jsonl(tmp_path / "reverse.jsonl", rows)


def _settings(path: Path, **changes: Any) -> DataSettings:
    base = DataSettings(
        uri=str(path),
        validation_uri=None,
        fmt="alpaca",
        max_seq_length=128,
        packing=True,
        skip_malformed=False,
        held_out_fraction=0.1,
        seed=5,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("packing", [True, False])
def test_rows_are_those_the_trainer_built_in_memory(
    tmp_path: Path, dataset: Path, tok: PreTrainedTokenizerFast, packing: bool
) -> None:
    settings = _settings(dataset, packing=packing)
    data = prepare(settings, tok, tmp_path / "cache", local_rank=0)
    loaded = load_samples(str(dataset), "alpaca", tok, 128, skip_malformed=False)
    train_idx, val_idx = split_validation(len(loaded.samples), 0.1, seed=5)
    train = [loaded.samples[i] for i in train_idx]
    expected = pack(train, 128) if packing else unpacked(train)
    assert list(data.rows) == expected and any(len(r.lengths) > 1 for r in expected) == packing
    assert list(data.val_rows) == unpacked([loaded.samples[i] for i in val_idx])
    assert data.tokenized and data.rows[-1] == expected[-1] and data.rows[1:3] == expected[1:3]


def test_a_second_call_reads_the_arrays_without_tokenising(
    tmp_path: Path, dataset: Path, tok: PreTrainedTokenizerFast
) -> None:
    first, again = CountingTokenizer(tok), CountingTokenizer(tok)
    built = prepare(_settings(dataset), first, tmp_path / "cache", local_rank=0)
    reused = prepare(_settings(dataset), again, tmp_path / "cache", local_rank=0)
    assert first.calls > 0 and again.calls == 0
    assert built.tokenized and not reused.tokenized and list(reused.rows) == list(built.rows)
    assert type(reused.rows.arrays["ids"]).__name__ == "memmap"


def test_ranks_of_a_node_get_identical_rows_and_only_local_rank_0_tokenises(
    tmp_path: Path, dataset: Path, tok: PreTrainedTokenizerFast
) -> None:
    counters = {rank: CountingTokenizer(tok) for rank in range(3)}
    results: dict[int, Any] = {}

    def follower(rank: int) -> None:
        results[rank] = prepare(_settings(dataset), counters[rank], tmp_path / "cache", local_rank=rank, timeout_s=30)

    threads = [threading.Thread(target=follower, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()  # waiting before local rank 0 has begun
    results[0] = prepare(_settings(dataset), counters[0], tmp_path / "cache", local_rank=0)
    for thread in threads:
        thread.join(30)
    assert counters[0].calls > 0 and counters[1].calls == counters[2].calls == 0
    assert [r.tokenized for r in (results[0], results[1], results[2])] == [True, False, False]
    reference: list[Row] = list(results[0].rows)
    assert list(results[1].rows) == reference and list(results[2].rows) == reference
    assert results[1].folder == results[0].folder
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [results[0].folder.name]  # no staging left


def test_a_partly_written_folder_is_never_read(tmp_path: Path, dataset: Path, tok: PreTrainedTokenizerFast) -> None:
    """A writer that died mid-way leaves only its staging folder: the others keep waiting, then say why."""
    cache = tmp_path / "cache"
    key = cache_key(_settings(dataset), tok)
    staging = cache / f".{key}.otherhost.99.tmp"
    staging.mkdir(parents=True)
    (staging / "train_ids.npy").write_bytes(b"\x93NUMPY")  # truncated
    with pytest.raises(DataUnavailable, match=r"local rank 0 did not finish tokenising the dataset .* within 1s"):
        prepare(_settings(dataset), tok, cache, local_rank=1, timeout_s=1.0)
    data = prepare(_settings(dataset), tok, cache, local_rank=0)  # the next attempt writes a whole folder
    assert data.folder.name == key and len(data.rows) > 0


def test_a_wait_limit_that_is_not_a_number_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dataset: Path, tok: PreTrainedTokenizerFast
) -> None:
    monkeypatch.setenv(prepared.TIMEOUT_ENV, "1h")
    with pytest.raises(DataError, match=r"^FTJOB_DATA_PREPARE_TIMEOUT_S='1h': must be a number of seconds"):
        prepare(_settings(dataset), tok, tmp_path / "cache", local_rank=1)


def test_a_broken_line_fails_every_rank_with_its_file_and_line(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "i", "output": "o"}, "{not json"])
    message = rf"{path}:2: malformed alpaca record: not valid JSON"
    with pytest.raises(DataError, match=message):
        prepare(_settings(path), tok, tmp_path / "cache", local_rank=0)
    with pytest.raises(DataError, match=message) as waiting:  # at once, not after the timeout
        prepare(_settings(path), tok, tmp_path / "cache", local_rank=1, timeout_s=30)
    assert not isinstance(waiting.value, DataUnavailable)


def test_skipped_records_and_demo_records_survive_the_cache(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"instruction": "i", "output": "o"}, "{x", {"instruction": "j", "output": "p"}]
    )
    prepare(_settings(path, skip_malformed=True), tok, tmp_path / "cache", local_rank=0)
    data = prepare(_settings(path, skip_malformed=True), tok, tmp_path / "cache", local_rank=1)
    assert data.skipped == 1 and len(data.warnings) == 1 and f"{path}:2:" in data.warnings[0]
    demo = prepare(_settings(Path("x"), uri="builtin://reverse-words", held_out_fraction=0.5), tok, tmp_path / "c", 0)
    assert demo.demo_records and all("output" in r for r in demo.demo_records)


def test_the_key_changes_with_every_input(tmp_path: Path, dataset: Path, tok: PreTrainedTokenizerFast) -> None:
    base = _settings(dataset)
    key = cache_key(base, tok)
    assert cache_key(_settings(dataset), tok) == key
    other_values: dict[str, Any] = {
        "uri": f"file://{dataset}",
        "validation_uri": str(dataset),
        "fmt": "text",
        "max_seq_length": 129,
        "packing": False,
        "skip_malformed": True,
        "held_out_fraction": 0.2,
        "seed": 6,
    }
    assert set(other_values) == {f.name for f in dataclasses.fields(DataSettings)}
    keys = {name: cache_key(dataclasses.replace(base, **{name: value}), tok) for name, value in other_values.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(keys), keys

    assert cache_key(base, builtin_models.build_tokenizer(256)) != key  # another vocabulary
    templated = builtin_models.build_tokenizer(512)
    templated.chat_template = "{{ messages }}"
    assert cache_key(base, templated) != key

    content = dataset.read_bytes()
    dataset.write_bytes(content.replace(b"Reverse", b"Invert", 1))  # same file name, other bytes
    assert cache_key(base, tok) != key
    dataset.write_bytes(content)
    assert cache_key(base, tok) == key


def test_the_key_covers_the_code_that_shapes_the_rows(
    monkeypatch: pytest.MonkeyPatch, dataset: Path, tok: PreTrainedTokenizerFast
) -> None:
    key = cache_key(_settings(dataset), tok)
    root = Path(prepared.__file__).resolve().parent.parent
    assert all((root / name).is_file() for name in prepared.CODE_FILES)
    monkeypatch.setattr(prepared, "CODE_FILES", prepared.CODE_FILES[:-1])
    assert cache_key(_settings(dataset), tok) != key


def test_a_preference_set_is_prepared_as_pairs_of_rows_split_by_example(tmp_path: Path, tok: Any) -> None:
    """Rows 2i and 2i+1 are one pair (chosen, rejected) sharing its prompt; the validation split
    takes whole pairs, and a reader of the cache knows the rows come in twos."""
    settings = _settings(tmp_path / "unused", uri="builtin://secret-code-preference", fmt="preference", packing=False)
    data = prepare(settings, tok, tmp_path / "cache", local_rank=0)
    examples = len(builtin_datasets.secret_code_preference_records())
    assert data.rows_per_example == 2
    assert len(data.rows) % 2 == 0 and len(data.val_rows) % 2 == 0
    assert (len(data.rows) + len(data.val_rows)) // 2 == examples
    assert len(data.val_rows) // 2 == pytest.approx(examples * 0.1, abs=1)
    for i in range(0, len(data.rows), 2):
        chosen, rejected = data.rows[i], data.rows[i + 1]
        prompt = next(n for n, label in enumerate(chosen.labels) if label != -100)
        assert chosen.input_ids[:prompt] == rejected.input_ids[:prompt]
        assert chosen.input_ids != rejected.input_ids
    again = prepare(settings, tok, tmp_path / "cache", local_rank=1)  # read back from the cache
    assert again.rows_per_example == 2 and len(again.rows) == len(data.rows)
    with pytest.raises(DataError, match="packing is not allowed with format preference"):
        prepare(dataclasses.replace(settings, packing=True), tok, tmp_path / "other", local_rank=0)
