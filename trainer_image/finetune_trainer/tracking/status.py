"""The publishers' state, in a small file rank 0's metrics endpoint reads on each scrape.

The publishers run in the pod's entrypoint, the metrics endpoint in rank 0's process; this
file (`<output>/tracking/status.json`, replaced atomically) is how the run's id and URL and
each sink's health reach the operator, which scrapes rank 0 (see `metrics.tracking`).
A new gang starts from the file the last one left: the run is the same, its health is not
known yet.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api.tracking import TRACKING_DIR

STATUS_FILE = "status.json"
WRITE_EVERY_S = 1.0
"""Changes that only move a count are written at most this often."""


def status_path(output: Path) -> Path:
    return output / TRACKING_DIR / STATUS_FILE


@dataclass
class SinkState:
    failing: bool = False
    reason: str = ""
    pending: int = 0
    published_step: int = -1


@dataclass
class TrackingStatus:
    run_id: str = ""
    experiment_id: str = ""
    run_url: str = ""
    tracking_uri: str = ""
    tensorboard_dir: str = ""
    sinks: dict[str, SinkState] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> TrackingStatus | None:
        try:
            raw: Any = json.loads(path.read_text())
            sinks = {str(k): SinkState(**v) for k, v in raw.pop("sinks", {}).items()}
            return cls(**raw, sinks=sinks)
        except (OSError, ValueError, TypeError):
            return None


class StatusBoard:
    """Thread-safe holder of the status, written to disk when it changes (counts at most once a second)."""

    def __init__(self, path: Path, initial: TrackingStatus) -> None:
        self.path = path
        self._status = initial
        self._lock = threading.Lock()
        self._written_at = 0.0
        self._written: str = ""
        self.write(force=True)

    def snapshot(self) -> TrackingStatus:
        with self._lock:
            sinks = {k: SinkState(**asdict(v)) for k, v in self._status.sinks.items()}
            return TrackingStatus(**{**asdict(self._status), "sinks": sinks})

    def update_run(self, **fields: str) -> None:
        with self._lock:
            for key, value in fields.items():
                setattr(self._status, key, value)
        self.write(force=True)

    def update_sink(self, name: str, force: bool = False, **fields: Any) -> None:
        with self._lock:
            state = self._status.sinks.setdefault(name, SinkState())
            health = (state.failing, state.reason)
            for key, value in fields.items():
                setattr(state, key, value)
            changed_health = health != (state.failing, state.reason)
        self.write(force=force or changed_health)

    def write(self, force: bool = False) -> None:
        with self._lock:
            text = json.dumps(asdict(self._status), sort_keys=True)
            if text == self._written or (not force and time.monotonic() - self._written_at < WRITE_EVERY_S):
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(text)
                tmp.replace(self.path)
            except OSError:
                return  # a full volume: the metrics go stale, training does not care
            self._written, self._written_at = text, time.monotonic()
