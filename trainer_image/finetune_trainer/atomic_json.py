"""A JSON file that is either absent or whole: written under a temporary name, then renamed.

Readers poll for these files (the completion marker, the run summary, a data-preparation
error), so a reader must never see one half-written. The temporary name carries the writer's
pid, so two processes writing the same path never share a staging file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(staging, path)
