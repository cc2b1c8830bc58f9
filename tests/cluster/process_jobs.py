"""Jobs whose ranks really run on the process node: the tiny CPU example placed there, and the
training processes the node runs for a pod (to kill or freeze them as a fault would).

Shared by the end-to-end tests of the default cluster and the Kueue module's own cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster import PROCESS_NODE_PLACEMENT

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
CLAIM = "ftjob-output"
"""The output claim the example writes to (`pvc://ftjob-output/...`)."""


def tiny_job(namespace: str, max_steps: int, checkpoint_every: int) -> dict[str, Any]:
    """examples/tiny-cpu.yaml on the process node, `max_steps` long, evaluated only at the end."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["training"].update(
        {"maxSteps": max_steps, "checkpointEverySteps": checkpoint_every, "evalEverySteps": max_steps}
    )
    doc["spec"]["resources"].update(PROCESS_NODE_PLACEMENT)
    return doc


def worker_pids(pod: str, namespace: str) -> list[int]:
    """Training ranks (finetune_trainer.worker) that the process node runs for `pod`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"finetune_trainer.worker" in cmdline
            and f"FTJOB_POD_NAME={pod}".encode() in environ
            and (f"FTJOB_NAMESPACE={namespace}".encode() in environ)
        ):
            found.append(int(entry.name))
    return found
