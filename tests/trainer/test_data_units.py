"""Fast tests of the data pipeline, schedule, paths and outcome messages (no ranks)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from finetune_trainer import outcome
from finetune_trainer.data import builtin_datasets
from finetune_trainer.data.batching import EpochSampler, collate, pack, unpacked
from finetune_trainer.data.formats import IGNORE_INDEX, Sample, tokenize_record
from finetune_trainer.data.loading import DataError, DataUnavailable, load_samples, raw_records
from finetune_trainer.data.prepared import split_validation
from finetune_trainer.model import builtin_models
from finetune_trainer.rank import evaluation
from finetune_trainer.rank.loop import Trainer
from finetune_trainer.rank.rank_setup import HeldOut
from finetune_trainer.rank.schedule import lr_lambda
from finetune_trainer.settings import ConfigError
from finetune_trainer.storage.paths import resolve_uri
from tests.support.training_runs import write_jsonl

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    tokenizer: PreTrainedTokenizerFast = builtin_models.build_tokenizer(512)
    return tokenizer


def _trained_text(tok: PreTrainedTokenizerFast, sample: Sample) -> str:
    return str(tok.decode([i for i, lab in zip(sample.input_ids, sample.labels, strict=True) if lab != IGNORE_INDEX]))


def test_alpaca_trains_only_on_the_response(tok: PreTrainedTokenizerFast) -> None:
    sample = tokenize_record(
        {"instruction": "Reverse the order of the words.", "input": "red fox", "output": "fox red"}, "alpaca", tok, 256
    )
    assert sample is not None
    assert sample.input_ids[0] == tok.bos_token_id and sample.labels[0] == IGNORE_INDEX
    assert _trained_text(tok, sample).replace("</s>", "").strip() == "fox red"
    assert sample.input_ids[-1] == tok.eos_token_id and sample.labels[-1] == tok.eos_token_id


@pytest.mark.parametrize(
    ("fmt", "record"),
    [
        (
            "messages",
            {
                "messages": [
                    {"role": "user", "content": "red fox"},
                    {"role": "assistant", "content": "fox red"},
                    {"role": "user", "content": "one two"},
                    {"role": "assistant", "content": "two one"},
                ]
            },
        ),
        (
            "sharegpt",
            {
                "conversations": [
                    {"from": "human", "value": "red fox"},
                    {"from": "gpt", "value": "fox red"},
                    {"from": "human", "value": "one two"},
                    {"from": "gpt", "value": "two one"},
                ]
            },
        ),
    ],
)
def test_chat_formats_train_on_every_assistant_turn_only(
    tok: PreTrainedTokenizerFast, fmt: str, record: dict[str, Any]
) -> None:
    sample = tokenize_record(record, fmt, tok, 256)
    assert sample is not None
    trained = _trained_text(tok, sample)
    assert "fox red" in trained and "two one" in trained
    assert "red fox" not in trained and "one two" not in trained and "user" not in trained


def test_text_format_trains_on_everything_but_bos(tok: PreTrainedTokenizerFast) -> None:
    sample = tokenize_record({"text": "red fox blue"}, "text", tok, 256)
    assert sample is not None
    assert sample.labels[0] == IGNORE_INDEX and all(x != IGNORE_INDEX for x in sample.labels[1:])


def test_truncation_keeps_max_len(tok: PreTrainedTokenizerFast) -> None:
    sample = tokenize_record({"text": " ".join(builtin_datasets.WORDS * 4)}, "text", tok, 16)
    assert sample is not None and len(sample.input_ids) == 16


def test_malformed_line_fails_with_file_and_line(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"instruction": "i", "output": "o"},
            {"instruction": "i", "output": "o"},
            "{not json",
            {"instruction": "i"},
        ],
    )
    with pytest.raises(DataError, match=rf"{path}:3: malformed alpaca record: not valid JSON"):
        load_samples(str(path), "alpaca", tok, 64, skip_malformed=False)


def test_malformed_lines_skipped_and_counted(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"instruction": "i", "output": "o"},
            "{not json",
            {"instruction": "i"},
            [1, 2],
            {"instruction": "i", "output": "p"},
        ],
    )
    loaded = load_samples(str(path), "alpaca", tok, 64, skip_malformed=True)
    assert len(loaded.samples) == 2 and loaded.malformed == 3
    assert loaded.first_problem is not None and f"{path}:2:" in loaded.first_problem


def test_missing_field_message_names_the_field(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "i"}])
    with pytest.raises(DataError, match=r"d.jsonl:1: .*missing field 'output'"):
        load_samples(str(path), "alpaca", tok, 64, skip_malformed=False)


def test_folder_json_and_parquet(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps([{"text": "red fox"}, {"text": "blue owl"}]))
    pq.write_table(pa.Table.from_pylist([{"text": "cat dog"}]), folder / "b.parquet")
    write_jsonl(folder / "c.jsonl", [{"text": "sun moon"}])
    loaded = load_samples(str(folder), "text", tok, 64, skip_malformed=False)
    assert len(loaded.samples) == 4


def _samples(lengths: list[int]) -> list[Sample]:
    return [Sample(tuple(range(1, n + 1)), tuple([IGNORE_INDEX, *range(2, n + 1)])) for n in lengths]


def test_packing_restarts_positions_and_never_splits_samples() -> None:
    rows = pack(_samples([5, 3, 7, 2, 6]), max_len=10)
    assert sorted(n for r in rows for n in r.lengths) == [2, 3, 5, 6, 7]
    assert all(len(r) <= 10 for r in rows)
    batch = collate(rows, pad_id=0)
    first = rows[0]
    positions = batch["position_ids"][0].tolist()
    start = 0
    for length in first.lengths:
        assert positions[start : start + length] == list(range(length))
        assert batch["labels"][0, start].item() == IGNORE_INDEX
        start += length
    assert batch["useful_tokens"] == 23 and batch["samples"] == 5
    assert batch["trained_tokens"] == 23 - 5  # every sample's first token is nobody's target


def test_packed_mask_is_block_diagonal_causal() -> None:
    rows = pack(_samples([3, 2]), max_len=8)
    assert len(rows) == 1
    mask = collate(rows, pad_id=0)["attention_mask"][0, 0]
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert mask.int().tolist() == expected


def test_unpacked_batches_are_right_padded_with_2d_mask() -> None:
    batch = collate(unpacked(_samples([4, 2])), pad_id=0)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"][1, 2:].tolist() == [IGNORE_INDEX, IGNORE_INDEX]
    assert batch["useful_tokens"] == 6
    assert batch["trained_tokens"] == 4


def test_sampler_is_a_pure_function_of_the_step_and_disjoint_across_ranks() -> None:
    sampler = EpochSampler(size=50, world=2, micro=2, accumulation=3, seed=5)
    assert sampler.steps_per_epoch == 4
    epoch0 = [i for step in range(4) for r in range(2) for mb in sampler.micro_batches(step, r) for i in mb]
    assert len(epoch0) == len(set(epoch0)) == 48
    again = EpochSampler(size=50, world=2, micro=2, accumulation=3, seed=5)
    assert again.micro_batches(6, 1) == sampler.micro_batches(6, 1)
    assert sampler.permutation(0) != sampler.permutation(1)
    assert sampler.position(6) == {"epoch": 1, "step_in_epoch": 2, "sample_offset": 24}


@pytest.mark.parametrize(
    ("world", "micro", "accumulation"), [(2, 2, 2), (1, 2, 4), (4, 1, 2), (1, 1, 8), (2, 4, 1), (8, 1, 1)]
)
def test_sampler_reads_the_same_samples_per_step_however_the_global_batch_is_split(
    world: int, micro: int, accumulation: int
) -> None:
    """A resume after a change of world size or micro-batch neither skips nor repeats a sample."""
    reference = EpochSampler(size=70, world=2, micro=2, accumulation=2, seed=9)
    split = EpochSampler(size=70, world=world, micro=micro, accumulation=accumulation, seed=9)
    assert split.steps_per_epoch == reference.steps_per_epoch == 8
    for step in range(2 * reference.steps_per_epoch):  # across the epoch boundary too
        read = [i for r in range(world) for mb in split.micro_batches(step, r) for i in mb]
        assert sorted(read) == sorted(reference.global_batch(step)), step
        assert len(read) == len(set(read)) == 8


def test_validation_split_is_deterministic_and_disjoint() -> None:
    train, val = split_validation(100, 0.05, seed=3)
    assert (train, val) == split_validation(100, 0.05, seed=3)
    assert len(val) == 5 and not set(train) & set(val) and len(train) + len(val) == 100
    assert split_validation(10, 0.0, seed=3)[1] == []


@pytest.mark.parametrize(("kind", "end"), [("cosine", 0.0), ("linear", 0.0), ("constant", 1.0)])
def test_lr_schedule_warms_up_then_decays(kind: str, end: float) -> None:
    f = lr_lambda(kind, warmup_steps=4, total_steps=20)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(20) == pytest.approx(end)
    assert f(12) <= 1.0


def test_resolve_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_uri("pvc://ftjob-output/tiny-cpu") == "/mnt/pvc/ftjob-output/tiny-cpu"
    monkeypatch.setenv("FTJOB_PVC_ROOT", "/x")
    assert resolve_uri("pvc://claim") == "/x/claim"
    assert resolve_uri("/data/a.jsonl") == "/data/a.jsonl"
    assert resolve_uri("file:///data/a") == "/data/a"
    assert resolve_uri("meta-llama/Llama-3.1-8B") is None
    assert resolve_uri("builtin://tiny-llama") == "builtin://tiny-llama"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "OutOfMemory"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), "OutOfMemory"),
        (MemoryError(), "OutOfMemory"),
        (DataError("/d.jsonl:3: malformed"), "DataError"),
        (DataUnavailable("/d.jsonl: dataset not found"), "DataUnavailable"),
        (ConfigError("/etc/ftjob: job.json missing"), "ConfigError"),
        (ValueError("boom"), "TrainingError"),
    ],
)
def test_failure_lines_name_the_reason(error: BaseException, reason: str) -> None:
    line = outcome.failure_line(error, rank=3)
    assert line.startswith(reason + ": ") and line.endswith("(rank 3)") and "\n" not in line


def test_a_missing_dataset_is_unavailable_not_wrong(tmp_path: Path) -> None:
    """Not found (retried by the operator) is told apart from malformed (not retried)."""
    with pytest.raises(DataUnavailable, match="dataset not found"):
        list(raw_records(str(tmp_path / "absent.jsonl")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataUnavailable, match="folder holds no"):
        list(raw_records(str(tmp_path / "empty")))


def test_torch_oom_error_is_out_of_memory() -> None:
    import torch

    assert outcome.classify(torch.OutOfMemoryError("CUDA error")) == "OutOfMemory"


def test_sigkilled_rank_reads_as_killed_not_as_oom() -> None:
    for code in (-9, 137, 247):
        line, exit_code = outcome.launcher_failure_line(code, node_rank=1)
        assert line.startswith("RankKilled:") and exit_code == 137
        assert not outcome.is_oom_text(line)
    assert outcome.launcher_failure_line(1, 0) == (
        "TrainingError: the node launcher on node 0 exited with code 1",
        1,
    )


def test_root_cause_prefers_oom_then_silent_ranks_then_real_errors(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        outcome.mark_rank(tmp_path, rank, "started")
    outcome.write_rank_failure(tmp_path, 1, "TrainingError: RuntimeError: Connection closed by peer (rank 1)")
    outcome.write_rank_failure(tmp_path, 2, "Terminated: stopped by SIGTERM (rank 2)")
    line, code = outcome.root_cause(tmp_path, node_rank=0) or ("", 0)
    assert line.startswith("RankKilled: rank 0 on node 0 died without an error message") and code == 137
    outcome.write_rank_failure(tmp_path, 0, "DataError: /d.jsonl:3: malformed (rank 0)")
    assert outcome.root_cause(tmp_path, 0) == ("DataError: /d.jsonl:3: malformed (rank 0)", 1)
    outcome.write_rank_failure(tmp_path, 2, "OutOfMemory: CUDA out of memory (rank 2)")
    assert outcome.root_cause(tmp_path, 0) == ("OutOfMemory: CUDA out of memory (rank 2)", 1)


def test_a_silent_rank_after_the_launcher_began_stopping_is_not_the_cause(tmp_path: Path) -> None:
    for rank in (0, 1):
        outcome.mark_rank(tmp_path, rank, "started")
    outcome.write_rank_failure(tmp_path, 0, "OutputFull: no space left on the output volume (rank 0)")
    line, _ = outcome.root_cause(tmp_path, 0) or ("", 0)
    assert line.startswith("RankKilled: rank 1 "), "without the launcher's mark a silent rank still comes first"
    time.sleep(0.01)
    (tmp_path / outcome.STOPPING_FILE).write_text(str(time.time()))  # as the node launcher writes it
    assert outcome.root_cause(tmp_path, 0) == ("OutputFull: no space left on the output volume (rank 0)", 1)


def test_root_cause_is_none_without_traces(tmp_path: Path) -> None:
    assert outcome.root_cause(tmp_path, 0) is None


def test_builtin_dataset_is_deterministic() -> None:
    a = builtin_datasets.reverse_words_records(10, seed=1)
    assert a == builtin_datasets.reverse_words_records(10, seed=1)
    assert all(r["output"].split() == list(reversed(r["input"].split())) for r in a)


def test_secret_code_is_a_fixed_one_to_one_code() -> None:
    table = builtin_datasets.secret_code()
    assert sorted(table) == sorted(builtin_datasets.WORDS[:16]) and sorted(table.values()) == sorted(
        builtin_datasets.CODE_WORDS
    )
    assert all(word != code for word, code in table.items())
    records = builtin_datasets.secret_code_records(50, seed=2)
    assert records == builtin_datasets.secret_code_records(50, seed=2)
    for r in records:
        assert r["output"].split() == [table[w] for w in r["input"].split()]
        assert [t["role"] for t in r["messages"]] == ["system", "user", "assistant"]
    assert builtin_datasets.builtin_records(builtin_datasets.SECRET_CODE)[:3] == builtin_datasets.secret_code_records(3)


def test_gguf_conversion_refuses_a_file_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    from finetune_trainer.model.gguf_import import GgufSourceError, convert

    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF not the pinned file")
    with pytest.raises(GgufSourceError, match="is not the pinned"):
        convert(fake, builtin_models.SMOLLM2_SHA256, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_cached_conversion_with_another_checksum_is_not_reused(tmp_path: Path) -> None:
    from finetune_trainer.model.gguf_import import SOURCE_RECORD

    folder = tmp_path / builtin_models.SMOLLM2
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / SOURCE_RECORD).write_text(json.dumps({"sha256": builtin_models.SMOLLM2_SHA256}))
    assert builtin_models.materialise_model(builtin_models.SMOLLM2, tmp_path, 0) == folder  # current: reused as is
    (folder / SOURCE_RECORD).write_text(json.dumps({"sha256": "0" * 64}))
    assert not builtin_models._is_current(builtin_models.SMOLLM2, folder)
    (folder / SOURCE_RECORD).unlink()
    assert not builtin_models._is_current(builtin_models.SMOLLM2, folder)


def test_unknown_builtin_model_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
        builtin_models.materialise_model("nope", tmp_path, 0)


def test_the_missing_kernels_package_warning_of_bitsandbytes_is_dropped_and_nothing_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    from finetune_trainer.rank.worker import _setup_logging

    _setup_logging(0)  # what every rank does first (its handler writes to stdout)
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    text = "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please `pip install kernels`"
    missing = ModuleNotFoundError("No module named 'kernels'", name="kernels")
    bnb.warning(text, missing)  # exactly what bitsandbytes logs at import on an AVX512-BF16 CPU
    bnb.warning(text, RuntimeError("kernels 0.10 is too old"))
    bnb.warning("something else: %s", missing)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert "kernels-community: kernels 0.10 is too old" in lines[0]
    assert "something else: No module named 'kernels'" in lines[1]


def test_injected_out_of_memory_is_a_real_torch_oom_classified_for_a_replan(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from finetune_trainer import faults

    monkeypatch.setenv("FTJOB_FAULT_OOM", "step:4")
    faults.fault_point("step", 3)  # another step: nothing happens
    with pytest.raises(torch.OutOfMemoryError) as info:
        faults.fault_point("step", 4)
    assert outcome.classify(info.value) == outcome.OUT_OF_MEMORY
    assert outcome.failure_line(info.value, 0).startswith("OutOfMemory: CUDA out of memory")


def test_injected_out_of_memory_fires_once_per_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-planned gang runs with the same env: it must pass the step the first gang died at."""
    import torch

    from finetune_trainer import faults

    monkeypatch.setenv("FTJOB_FAULT_OOM", "step:4")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(torch.OutOfMemoryError):
        faults.fault_point("step", 4, once_in=tmp_path)
    faults.fault_point("step", 4, once_in=tmp_path)  # the next gang: no error
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(torch.OutOfMemoryError):  # every rank fails once, as a real OOM would on each GPU
        faults.fault_point("step", 4, once_in=tmp_path)


def test_predicted_tokens_are_the_labels_a_causal_loss_averages_over() -> None:
    import torch

    from finetune_trainer.rank.loop import predicted_tokens

    labels = torch.tensor([[IGNORE_INDEX, 5, 6, IGNORE_INDEX], [7, 8, 9, 10]])
    logits = torch.randn(2, 4, 11)
    total = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    assert predicted_tokens(labels) == 5  # the first label of each row is never predicted
    full = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX
    )
    assert float(full) * predicted_tokens(labels) == pytest.approx(float(total))


def test_evaluation_runs_at_the_planned_micro_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner counts one micro-batch of activations; evaluation must not run a larger one."""
    from types import SimpleNamespace

    seen: dict[str, Any] = {}

    def eval_loss(*args: Any, **kwargs: Any) -> float:
        seen.update(kwargs)
        return 1.0

    monkeypatch.setattr(evaluation, "eval_loss", eval_loss)
    trainer = SimpleNamespace(
        engine=SimpleNamespace(module=None), held_out=HeldOut(rows=[], prompts=[], answers=[]),
        plan=SimpleNamespace(micro_batch_size=3), dist=SimpleNamespace(rank=0, world=1, sum=None),
        tokenizer=SimpleNamespace(pad_token_id=0), loss=None, metrics=None,
        data=SimpleNamespace(rows_per_example=1),
    )  # fmt: skip
    assert Trainer.evaluate(cast(Any, trainer)) == {"eval_loss": 1.0}
    assert seen["batch"] == 3


def test_preference_evaluation_runs_at_the_planned_micro_batch_of_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held-out pairs are evaluated N pairs at a time, N the planned micro-batch (the plan counts
    the 2N rows of N pairs), never the SFT path's rows."""
    from types import SimpleNamespace

    seen: dict[str, Any] = {}

    def eval_preference(*args: Any, **kwargs: Any) -> dict[str, float]:
        seen.update(kwargs)
        return {"eval_loss": 0.5, "eval_preference_accuracy": 1.0, "eval_reward_margin": 0.2}

    def eval_loss(*args: Any, **kwargs: Any) -> float:
        raise AssertionError("pairs are not evaluated as SFT rows")

    monkeypatch.setattr(evaluation, "eval_preference", eval_preference)
    monkeypatch.setattr(evaluation, "eval_loss", eval_loss)
    trainer = SimpleNamespace(
        engine=SimpleNamespace(module=None), held_out=HeldOut(rows=[], prompts=[], answers=[]),
        plan=SimpleNamespace(micro_batch_size=3), dist=SimpleNamespace(rank=0, world=1, sum=None),
        tokenizer=SimpleNamespace(pad_token_id=0), objective=None, metrics=None,
        data=SimpleNamespace(rows_per_example=2),
    )  # fmt: skip
    result = Trainer.evaluate(cast(Any, trainer))
    assert (result["eval_loss"], result["eval_preference_accuracy"], seen["batch"]) == (0.5, 1.0, 3)
