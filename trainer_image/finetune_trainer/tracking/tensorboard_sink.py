"""TensorBoard event files under `<output>/tensorboard`, with the same scalars as the MLflow run.

Each gang writes a new event file (TensorBoard reads a folder of them in order). The step
published last is kept beside them (`.published_step`, written after the events are flushed);
a gang's writer starts with TensorBoard's purge marker at the step after it, so events a
previous gang flushed past that point (it died between flushing and writing the marker) are
hidden by TensorBoard's reader, and no step is shown twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune_trainer.tracking.journal import Record

MARKER = ".published_step"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.writer: Any = None
        self.published = -1

    def connect(self) -> int:
        if self.writer is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            try:
                self.published = int((self.log_dir / MARKER).read_text().strip() or "-1")
            except (OSError, ValueError):
                self.published = -1
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.log_dir), purge_step=self.published + 1, flush_secs=3600)
        return self.published

    def publish(self, records: list[Record]) -> None:
        for record in records:
            for key, value in sorted(record.metrics.items()):
                self.writer.add_scalar(key, value, global_step=record.step, walltime=record.time_ms / 1000)
        self.writer.flush()
        last = records[-1].step
        tmp = self.log_dir / f"{MARKER}.tmp"
        tmp.write_text(f"{last}\n")
        tmp.replace(self.log_dir / MARKER)
        self.published = last

    def finish(self, artifacts: list[tuple[Path, str]], pointers: dict[str, str], failed: bool) -> None:
        self.close()

    def mark_failed(self) -> None:
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
