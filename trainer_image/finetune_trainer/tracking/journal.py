"""The tracking journal: the records a job publishes, one JSON line each, on its output volume.

Rank 0 appends to it (`JournalWriter`) only what a checkpoint holds: the records of the steps
up to the checkpoint being saved, written just before the save starts, and everything at the
end. Steps a failed gang took after its last checkpoint never reach the journal, and the
journal never takes a step it already has (a resumed gang that redoes steps the journal holds
skips them), so it lists every step once, in order. The publishers read it from the start
(`JournalReader`) and send what their sink has not committed; it outlives any server
outage and any gang, so nothing waits in memory that a restart could lose.

A line cut short by a crash is removed before the next append; a line that cannot be parsed
is skipped by the readers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api.tracking import TRACKING_DIR

RECORDS_FILE = "records.jsonl"
_TAIL_BYTES = 65536


def journal_path(output: Path) -> Path:
    return output / TRACKING_DIR / RECORDS_FILE


@dataclass(frozen=True)
class Record:
    """Metrics of one step (or one evaluation at that step), stamped with when the step ended."""

    step: int
    time_ms: int
    metrics: dict[str, float]

    def to_line(self) -> str:
        return json.dumps({"step": self.step, "time": self.time_ms, "metrics": self.metrics}, sort_keys=True) + "\n"

    @classmethod
    def from_line(cls, line: bytes | str) -> Record | None:
        try:
            raw: Any = json.loads(line)
            metrics = {str(k): float(v) for k, v in raw["metrics"].items()}
            return cls(int(raw["step"]), int(raw["time"]), metrics)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def finite_metrics(values: dict[str, Any]) -> dict[str, float]:
    """The numeric values of `values` (None, NaN and infinities left out: no tracker plots them alike)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


def _repair(path: Path) -> int:
    """Drop a torn last line; return the step of the last record (-1: none)."""
    if not path.exists():
        return -1
    with path.open("rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        start = max(0, size - _TAIL_BYTES)
        fh.seek(start)
        tail = fh.read()
        if tail and not tail.endswith(b"\n"):
            cut = tail.rfind(b"\n")
            if cut < 0 and start > 0:  # a torn line longer than the tail: read it all (never happens in practice)
                fh.seek(0)
                tail, start = fh.read(), 0
                cut = tail.rfind(b"\n")
            fh.truncate(start + cut + 1)
            tail = tail[: cut + 1]
        for line in reversed(tail.splitlines()):
            record = Record.from_line(line)
            if record is not None:
                return record.step
    return -1


class JournalWriter:
    """Rank 0's appends (one per checkpoint and one at the end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.last_step = _repair(path)

    def append(self, records: list[Record]) -> int:
        """Write the records of steps the journal does not hold yet, durably; returns how many."""
        fresh = [r for r in records if r.step > self.last_step]
        if not fresh:
            return 0
        with self.path.open("a") as fh:
            fh.write("".join(r.to_line() for r in fresh))
            fh.flush()
            os.fsync(fh.fileno())
        self.last_step = max(r.step for r in fresh)
        return len(fresh)


class JournalReader:
    """A publisher's cursor over the journal: batches of whole steps past what its sink committed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def next_batch(self, after: int, max_metrics: int) -> tuple[list[Record], int]:
        """Records with step > `after`, whole steps, about `max_metrics` metrics at most; and the offset
        to move to once they are published (lines skipped on the way included)."""
        batch: list[Record] = []
        count = 0
        end = self.offset
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return [], end
        with fh:
            fh.seek(self.offset)
            while True:
                line = fh.readline()
                if not line.endswith(b"\n"):
                    break  # end of file, or a line being written
                record = Record.from_line(line)
                if record is not None and record.step > after:
                    new_step = not batch or record.step != batch[-1].step
                    if batch and new_step and count + len(record.metrics) > max_metrics:
                        break
                    batch.append(record)
                    count += len(record.metrics)
                end += len(line)
        return batch, end

    def pending(self) -> int:
        """Lines past the cursor: what waits to be published (a few of them may be steps the sink
        already holds, skipped when read)."""
        waiting = 0
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                while chunk := fh.read(1 << 20):
                    waiting += chunk.count(b"\n")
        except FileNotFoundError:
            return 0
        return waiting
