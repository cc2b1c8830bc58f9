"""Jobs whose ranks really run on the process node: the tiny CPU example placed there, and the
training processes the node runs for a pod (to kill or freeze them as a fault would).

Shared by the end-to-end tests of the default cluster and the Kueue module's own cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster import PROCESS_NODE_PLACEMENT, LocalCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
CLAIM = "ftjob-output"
"""The output claim the example writes to (`pvc://ftjob-output/...`)."""
ADAPTER_ATOL = 1e-6
"""Two runs from the same checkpoint, world size, data position and RNG state do the same float
operations in the same order on CPU (gloo sums two ranks in a fixed order): their adapters are
expected equal bit for bit. The slack only absorbs summation-order noise; Adam moves a weight by
about the learning rate per step, so a lost, repeated or skipped step is far outside it."""


def output_dir(cluster: LocalCluster, namespace: str, job: str = "tiny-cpu") -> Path:
    """Where a job's `pvc://ftjob-output/<job>` output lands on the process node's claim."""
    return cluster.workdir / "pvc" / namespace / CLAIM / job


def assert_same_adapter(out: Path, reference: Path, context: object = "") -> None:
    """The adapter saved under `out` equals the one under `reference` within `ADAPTER_ATOL`."""
    from safetensors.torch import load_file

    got, want = (load_file(p / "adapter" / "adapter_model.safetensors") for p in (out, reference))
    assert got.keys() == want.keys() and want, (context, sorted(got), sorted(want))
    for key, tensor in want.items():
        diff = (got[key].float() - tensor.float()).abs().max().item()
        assert diff <= ADAPTER_ATOL, (context, key, diff)


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
    """Training ranks (finetune_trainer.rank.worker) that the process node runs for `pod`."""
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
            b"finetune_trainer.rank.worker" in cmdline
            and f"FTJOB_POD_NAME={pod}".encode() in environ
            and (f"FTJOB_NAMESPACE={namespace}".encode() in environ)
        ):
            found.append(int(entry.name))
    return found
