"""Rank 0's part of experiment tracking, inside the training loop: records held until a checkpoint.

The loop hands every train-log entry to `record` (a few dictionary operations: no I/O, no
network) and calls `commit` just before each checkpoint save and once at the end. `commit`
appends the held records to the journal (`journal.py`), which the pod's entrypoint publishes
from another process; a step the gang takes after its last checkpoint stays in memory and dies
with a failed gang, so the resumed gang's own values for it are the ones published, once.

Nothing here may fail a step: a journal that cannot be written (a full volume) is logged and
retried at the next checkpoint. Held records are bounded (`MAX_HELD`): beyond it, the oldest
are written without waiting for a checkpoint (only a failure before that checkpoint could then
publish a step the resumed gang redoes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from finetune_operator.api.tracking import mlflow_settings, tensorboard_enabled
from finetune_trainer.settings import JobConfig
from finetune_trainer.tracking.journal import JournalWriter, Record, finite_metrics, journal_path

log = logging.getLogger(__name__)

MAX_HELD = 10_000

TRAIN_METRICS = {
    "loss": "loss",
    "lr": "learning_rate",
    "grad_norm": "grad_norm",
    "tokens_per_second": "tokens_per_second",
    "epoch": "epoch",
    # preference objectives (DPO, ORPO) only: an SFT step has none of these keys, hence no such metric
    "rewards_chosen": "rewards_chosen",
    "rewards_rejected": "rewards_rejected",
    "reward_margin": "reward_margin",
    "preference_accuracy": "preference_accuracy",
}
"""Train-log key → metric name."""
EVAL_METRICS = {
    "eval_loss": "eval_loss",
    "exact_match": "exact_match",
    "eval_preference_accuracy": "eval_preference_accuracy",
}


def tracking_configured(cfg: JobConfig) -> bool:
    """Whether the job publishes anywhere (its job.json carries the operator's default URI already)."""
    tracking = cfg.job.spec.tracking
    return mlflow_settings(tracking, None) is not None or tensorboard_enabled(tracking)


def memory_peak_reader(on_gpu: bool) -> Callable[[], int | None]:
    """Rank 0's memory peak in bytes: the CUDA allocator's (reset each step while metrics are on),
    or on CPU the process's peak resident set."""
    if on_gpu:
        import torch

        return lambda: int(torch.cuda.max_memory_allocated())
    import resource

    return lambda: int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Recorder:
    def __init__(self, journal: JournalWriter, planned_bytes: int, memory_peak: Callable[[], int | None]) -> None:
        self.journal = journal
        self.planned_bytes = planned_bytes
        self.memory_peak = memory_peak
        self.held: list[Record] = []
        self._warned = False

    @classmethod
    def for_rank(cls, cfg: JobConfig, rank: int, on_gpu: bool) -> Recorder | None:
        """Rank 0's recorder when the job is tracked; None on other ranks and untracked jobs."""
        if rank != 0 or not tracking_configured(cfg):
            return None
        return cls(JournalWriter(journal_path(cfg.output)), cfg.plan.per_gpu_bytes, memory_peak_reader(on_gpu))

    def record(self, entry: dict[str, Any]) -> None:
        """A train-log entry: a step's metrics (`loss`, ...) or an evaluation (`eval`)."""
        step = entry.get("step")
        if not isinstance(step, int):
            return
        if isinstance(entry.get("eval"), dict):
            values = {name: entry["eval"].get(key) for key, name in EVAL_METRICS.items()}
        elif "loss" in entry:
            values = {name: entry.get(key) for key, name in TRAIN_METRICS.items()}
            peak = self.memory_peak()
            if peak:
                values["memory_peak_bytes"] = peak
                if self.planned_bytes > 0:
                    values["memory_peak_vs_plan"] = peak / self.planned_bytes
        else:
            return
        metrics = finite_metrics(values)
        if metrics:
            self.held.append(Record(step, int(time.time() * 1000), metrics))
        if len(self.held) > MAX_HELD:
            self._write(self.held[: len(self.held) - MAX_HELD // 2])

    def commit(self) -> None:
        """Everything held goes to the journal: called before a checkpoint save and at the end."""
        self._write(list(self.held))

    def _write(self, records: list[Record]) -> None:
        try:
            self.journal.append(records)
        except OSError as exc:
            if not self._warned:
                log.warning("tracking journal %s not written (%s); retried later", self.journal.path, exc)
                self._warned = True
            return
        done = {id(r) for r in records}
        self.held = [r for r in self.held if id(r) not in done]
