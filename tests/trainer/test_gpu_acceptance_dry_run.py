"""benchmarks/gpu_acceptance.py --dry-run: every section plans and runs its tiny CPU version.

The GPU run cannot happen in CI; the dry run keeps the script working there: the table has
its four sections, (a) the full matrix (3 methods × ZeRO 0-3 × checkpointing × 2 lengths)
with the planner's numbers, (b) a planned strategy for each emulated card, (c) QLoRA and
bf16 rows that ran, (d) the OutOfMemory root cause.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_dry_run_prints_the_whole_table() -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore", "MASTER_PORT": "0"}
    from .conftest import free_port

    env["MASTER_PORT"] = str(free_port())
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_acceptance.py"), "--dry-run"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=580,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.count(" | ") == 5]
    header, body = rows[0], rows[1:]
    assert header == ["section", "configuration", "planned GiB", "measured GiB", "ratio", "note"]
    by_section: dict[str, list[list[str]]] = {}
    for row in body:
        by_section.setdefault(row[0], []).append(row)
    assert sorted(by_section) == ["a", "b", "c", "d"]
    assert len(by_section["a"]) == 3 * 4 * 2 * 2
    for row in by_section["a"] + by_section["b"] + by_section["c"]:
        float(row[2])  # the planner's per-GPU GiB is there
    ran = [r for r in by_section["a"] if r[5].startswith("ok")]
    assert len(ran) == 3 * 4, by_section["a"]
    assert [r[1].split(":")[0] for r in by_section["b"]] == [
        "8B lora on 24 GiB",
        "8B lora on 40 GiB",
        "8B lora on 80 GiB",
    ]
    assert all("ZeRO-" in r[1] and r[5].startswith("ok") for r in by_section["b"]), by_section["b"]
    assert all(r[5].startswith("ok") for r in by_section["c"]), by_section["c"]
    assert by_section["d"][0][5].startswith("OutOfMemory:")
