"""Everything one rank exports, behind the four calls the training loop makes.

The loop calls `engine_ready` once, `step_started` and `step_done` around each optimizer
step and `checkpoint_done` after a save; the memory and communication collectors hang off
these so the loop stays about training. Communication accounting is installed at
construction, before `deepspeed.initialize`, so the start-up broadcasts are counted too.

FTJOB_METRICS_ALTERNATE=1 (benchmarks/metrics_overhead.py) pauses all of it on steps 1 and 2
of every 4 (on, off, off, on), so one run compares steps with and without the accounting
side by side.

FTJOB_METRICS_STEP_LOG=PATH appends one JSON line per rank and step with the step's
collectives by op (count, bytes, bus bytes, seconds) and the model-state sample: the
comm-bytes benchmark reads it, and it helps when no Prometheus is at hand.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from finetune_trainer.metrics.comm import CommMetrics, OpTotals, deltas
from finetune_trainer.metrics.memory import MemoryMetrics
from finetune_trainer.metrics.progress import ProgressMetrics
from finetune_trainer.metrics.storage import ObjectStorageCollector

STEP_LOG_ENV = "FTJOB_METRICS_STEP_LOG"
ALTERNATE_ENV = "FTJOB_METRICS_ALTERNATE"


class RankMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        info: dict[str, str],
        *,
        on_gpu: bool,
        planned: dict[str, int],
        comm: bool = True,
    ) -> None:
        self.rank = int(info.get("rank", "0"))
        self.progress = ProgressMetrics(registry, info)
        self.memory = MemoryMetrics(registry, self.rank, on_gpu, planned)
        self.comm = CommMetrics(registry, on_gpu=on_gpu)
        registry.register(ObjectStorageCollector())
        if comm:
            self.comm.install()
        self._step_start: dict[str, OpTotals] = self.comm.totals.snapshot()
        raw = os.environ.get(STEP_LOG_ENV, "")
        self._step_log = Path(raw) if raw else None
        self._log_lock = threading.Lock()
        self.alternate = os.environ.get(ALTERNATE_ENV, "") == "1"
        self.paused = False

    def engine_ready(self, engine: Any) -> None:
        self.memory.watch(engine)

    def pause(self, paused: bool) -> None:
        """Stop (or resume) all accounting: collectives pass straight through, no hooks run."""
        self.paused = self.comm.paused = self.memory.paused = paused

    def step_started(self) -> None:
        if self.paused:
            return
        self.memory.step_started()
        self._step_start = self.comm.totals.snapshot()

    def step_done(self, **progress: Any) -> None:
        if self.paused:
            return
        self.progress.step_done(**progress)
        self.memory.step_done()
        self.comm.resolve_gpu_timings()
        if self._step_log is not None:
            entry = {
                "rank": self.rank,
                "step": progress.get("step"),
                "seconds": progress.get("seconds"),
                "comm": deltas(self._step_start, self.comm.totals.snapshot()),
                "model_state": self.memory.state_bytes(),
            }
            with self._log_lock, self._step_log.open("a") as fh:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")

    def checkpoint_done(self, seconds: float) -> None:
        self.progress.checkpoint_done(seconds)

    def close(self) -> None:
        self.comm.uninstall()
