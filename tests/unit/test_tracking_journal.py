"""The tracking journal and rank 0's recorder: what a checkpoint holds is published, once.

Two gangs are played by two recorders over one output folder, as a gang restart leaves it:
the first dies after its checkpoint, the second resumes from it and redoes the steps after.
TensorBoard's own reader checks the event files a resumed writer leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_trainer.tracking import recorder as recorder_module
from finetune_trainer.tracking.journal import JournalReader, JournalWriter, Record, journal_path
from finetune_trainer.tracking.recorder import Recorder
from finetune_trainer.tracking.tensorboard_sink import TensorBoardSink


def train_entry(step: int, loss: float) -> dict[str, object]:
    return {"step": step, "loss": loss, "lr": 1e-3, "grad_norm": None, "tokens_per_second": 100.0, "epoch": 0.1}


def gang(output: Path, peak: int = 3 * 2**30, planned: int = 4 * 2**30) -> Recorder:
    return Recorder(JournalWriter(journal_path(output)), planned, lambda: peak)


def journal_steps(output: Path, metric: str = "loss") -> list[tuple[int, float]]:
    lines = journal_path(output).read_text().splitlines()
    records = [Record.from_line(line) for line in lines]
    return [(r.step, r.metrics[metric]) for r in records if r is not None and metric in r.metrics]


def test_steps_after_the_last_checkpoint_of_a_failed_gang_are_never_published(tmp_path: Path) -> None:
    first = gang(tmp_path)
    first.record({"step": 0, "eval": {"eval_loss": 6.0, "examples": []}})
    for step in range(1, 5):
        first.record(train_entry(step, 10.0 - step))
    first.commit()  # the checkpoint at step 4
    for step in (5, 6):
        first.record(train_entry(step, 99.0))  # then the gang dies
    second = gang(tmp_path)  # resumes from step 4 and redoes 5 and 6
    for step in range(5, 9):
        second.record(train_entry(step, 10.0 - step))
    second.record({"step": 8, "eval": {"eval_loss": 1.5, "exact_match": 0.5}})
    second.commit()  # the end
    assert journal_steps(tmp_path) == [(s, 10.0 - s) for s in range(1, 9)]
    assert journal_steps(tmp_path, "eval_loss") == [(0, 6.0), (8, 1.5)]
    assert journal_steps(tmp_path, "exact_match") == [(8, 0.5)]


def test_a_gang_resumed_from_an_older_checkpoint_skips_what_the_journal_holds(tmp_path: Path) -> None:
    first = gang(tmp_path)
    for step in range(1, 9):
        first.record(train_entry(step, float(step)))
    first.commit()
    second = gang(tmp_path)  # the step-8 checkpoint was damaged: resumed from step 4
    for step in range(5, 11):
        second.record(train_entry(step, 100.0 + step))
    second.commit()
    assert journal_steps(tmp_path) == [(s, float(s)) for s in range(1, 9)] + [(9, 109.0), (10, 110.0)]


def test_a_record_carries_the_metrics_of_its_step(tmp_path: Path) -> None:
    recorder = gang(tmp_path, peak=3 * 2**30, planned=4 * 2**30)
    recorder.record(train_entry(1, 2.5))
    recorder.record({"step": 1, "loss": float("nan"), "lr": 1e-3})
    recorder.record({"seconds": 1.0})  # no step: not a record
    recorder.commit()
    first, second = (json.loads(x)["metrics"] for x in journal_path(tmp_path).read_text().splitlines())
    assert first == {
        "loss": 2.5,
        "learning_rate": 1e-3,
        "tokens_per_second": 100.0,
        "epoch": 0.1,
        "memory_peak_bytes": 3 * 2**30,
        "memory_peak_vs_plan": 0.75,
    }
    assert "loss" not in second and second["learning_rate"] == 1e-3  # NaN is no point on a curve


def test_a_preference_step_and_evaluation_carry_the_rewards_and_accuracy_to_tensorboard(tmp_path: Path) -> None:
    recorder = gang(tmp_path, peak=0)
    rewards = {"rewards_chosen": 0.25, "rewards_rejected": -0.125, "reward_margin": 0.375, "preference_accuracy": 0.75}
    recorder.record({**train_entry(1, 0.6), **rewards})
    recorder.record(
        {"step": 1, "eval": {"eval_loss": 0.65, "eval_preference_accuracy": 0.625, "eval_reward_margin": 0.5}}
    )
    recorder.commit()
    step, evaluation = (json.loads(x)["metrics"] for x in journal_path(tmp_path).read_text().splitlines())
    assert step == {"loss": 0.6, "learning_rate": 1e-3, "tokens_per_second": 100.0, "epoch": 0.1, **rewards}
    assert evaluation == {"eval_loss": 0.65, "eval_preference_accuracy": 0.625}
    log_dir = tmp_path / "tensorboard"
    sink = TensorBoardSink(log_dir)
    assert sink.connect() == -1
    records, _ = JournalReader(journal_path(tmp_path)).next_batch(after=-1, max_metrics=100)
    sink.publish(records)
    sink.close()
    for tag, expected in {**rewards, "eval_preference_accuracy": 0.625}.items():
        assert scalars(log_dir, tag) == [(1, expected)], tag


def test_held_records_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "MAX_HELD", 10)
    recorder = gang(tmp_path)
    for step in range(1, 26):
        recorder.record(train_entry(step, 1.0))
    assert len(recorder.held) <= 10
    recorder.commit()
    assert [s for s, _ in journal_steps(tmp_path)] == list(range(1, 26))


def test_a_full_volume_never_fails_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = gang(tmp_path)

    def full(records: list[Record]) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recorder.journal, "append", full)
    recorder.record(train_entry(1, 1.0))
    recorder.commit()
    assert len(recorder.held) == 1
    monkeypatch.undo()
    recorder.commit()
    assert journal_steps(tmp_path) == [(1, 1.0)] and recorder.held == []


def test_a_line_cut_short_by_a_crash_is_dropped_before_the_next_append(tmp_path: Path) -> None:
    path = journal_path(tmp_path)
    JournalWriter(path).append([Record(1, 1000, {"loss": 1.0})])
    with path.open("a") as fh:
        fh.write('{"metrics": {"loss": 2.0}, "step": 2, "ti')  # the crash
    writer = JournalWriter(path)
    assert writer.last_step == 1
    writer.append([Record(2, 2000, {"loss": 2.5})])
    assert journal_steps(tmp_path) == [(1, 1.0), (2, 2.5)]


def test_the_reader_hands_out_whole_steps_past_what_the_sink_holds(tmp_path: Path) -> None:
    path = journal_path(tmp_path)
    records = [Record(s, s * 1000, {"loss": float(s), "lr": 0.1}) for s in range(1, 7)]
    records.insert(4, Record(4, 4500, {"eval_loss": 3.0}))  # an evaluation at step 4
    JournalWriter(path).append(records)
    with path.open("a") as fh:
        fh.write('{"step": 7, "time": 7000, "metr')  # being written: not read
    reader = JournalReader(path)
    batch, _ = reader.next_batch(after=1, max_metrics=5)
    assert [r.step for r in batch] == [2, 3]  # step 4 would pass 5 metrics
    batch, end = reader.next_batch(after=1, max_metrics=6)
    assert [r.step for r in batch] == [2, 3, 4, 4]  # step 4 is not split, though its evaluation passes 6
    reader.offset = end
    assert reader.pending() == 2
    batch, end = reader.next_batch(after=1, max_metrics=100)
    assert [r.step for r in batch] == [5, 6]
    reader.offset = end
    assert reader.next_batch(after=6, max_metrics=100)[0] == [] and reader.pending() == 0


def scalars(log_dir: Path, tag: str = "loss") -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_tensorboard_shows_each_step_once_after_a_gang_died_between_flush_and_marker(tmp_path: Path) -> None:
    log_dir = tmp_path / "tensorboard"
    first = TensorBoardSink(log_dir)
    assert first.connect() == -1
    first.publish([Record(s, s * 1000, {"loss": float(s)}) for s in (1, 2)])
    first.publish([Record(s, s * 1000, {"loss": 50.0 + s}) for s in (3, 4)])
    (log_dir / ".published_step").write_text("2\n")  # died after flushing 3 and 4, before the marker said so
    first.writer.close()
    second = TensorBoardSink(log_dir)
    assert second.connect() == 2
    second.publish([Record(s, s * 1000 + 500, {"loss": float(s)}) for s in (3, 4, 5)])
    second.close()
    assert scalars(log_dir) == [(s, float(s)) for s in range(1, 6)]
