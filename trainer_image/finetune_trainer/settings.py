"""The config directory a pod receives (job.json, plan.json, deepspeed.json, hostfile), parsed.

The operator renders it (`finetune_operator.render.config_files`); the trainer reads it back
through the same pydantic models and file names (`finetune_operator.api.pod_contract`), so a
field the renderer writes is a field the trainer understands. Environment variables that are
the pod's business (node rank, master address, output folder) are read here too, in one place.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api.job import FineTuneJob
from finetune_operator.api.pod_contract import DEEPSPEED_FILE, HOSTFILE, JOB_FILE, PLAN_FILE, TerminationReason
from finetune_operator.api.status import PlanStatus
from finetune_trainer.errors import TrainerError
from finetune_trainer.storage.paths import output_dir


class ConfigError(TrainerError, RuntimeError):
    """The config directory is missing a file or holds something unreadable."""

    reason = TerminationReason.CONFIG_ERROR


@dataclass(frozen=True)
class JobConfig:
    directory: Path
    job: FineTuneJob
    plan: PlanStatus
    deepspeed: dict[str, Any]
    hosts: tuple[tuple[str, int], ...]

    @property
    def output(self) -> Path:
        return output_dir(self.job.spec.output.uri)

    @property
    def world_size(self) -> int:
        return sum(slots for _, slots in self.hosts)


def parse_hostfile(text: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for part in parts[1:]:
            if part.startswith("slots="):
                slots = int(part[len("slots=") :])
        hosts.append((parts[0], slots))
    if not hosts:
        raise ConfigError("hostfile lists no hosts")
    return tuple(hosts)


def _read(directory: Path, name: str) -> str:
    path = directory / name
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None


def load_config(directory: str | Path) -> JobConfig:
    root = Path(directory)
    try:
        job = FineTuneJob.from_manifest(json.loads(_read(root, JOB_FILE)))
        plan = PlanStatus.from_wire(json.loads(_read(root, PLAN_FILE)))
        deepspeed = json.loads(_read(root, DEEPSPEED_FILE))
    except ValueError as exc:  # JSONDecodeError and pydantic's ValidationError
        raise ConfigError(f"{root}: invalid config: {' '.join(str(exc).split())[:500]}") from None
    return JobConfig(root, job, plan, deepspeed, parse_hostfile(_read(root, HOSTFILE)))


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default
