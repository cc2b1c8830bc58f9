"""What the process node keeps about each pod it runs: its containers' processes and states.

Plain records, shared by the agent (`process_node.py`), the container launcher
(`container_launch.py`), the readiness probes (`probes.py`) and the status it reports
(`pod_status.py`).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from finetune_localcluster.kube import Obj
from finetune_localcluster.pod_contents import hostname


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    spec: Obj
    init: bool
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    next_start: float = 0.0
    started_at: str = ""
    started_mono: float = 0.0
    done: bool = False  # terminated and will not be restarted
    ready: bool = False
    probe_at: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])


@dataclass
class PodRun:
    pod: Obj
    dir: Path
    ip: str
    inits: list[Container]
    ctrs: list[Container]
    volumes: dict[str, Path] = field(default_factory=dict)
    prepared: bool = False
    error: str = ""
    kill_deadline: float | None = None
    sent: Obj | None = None
    cond_times: dict[str, tuple[str, str]] = field(default_factory=dict)
    start_time: str = field(default_factory=now)
    hosts_at: float = 0.0

    @property
    def meta(self) -> Obj:
        return dict(self.pod["metadata"])

    @property
    def spec(self) -> Obj:
        return dict(self.pod["spec"])

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.meta['namespace']}/pods/{self.meta['name']}"

    @property
    def hostname(self) -> str:
        return hostname(self.pod)
