"""Every benchmark's `--smoke` mode runs to its table, the way a user runs the script.

A smoke run is the benchmark's own code at its smallest size: it must exit 0 and print the
rows of its table (each pattern below matches a measured row, numbers included). A script
added to benchmarks/ without an entry here fails `test_every_benchmark_has_a_smoke_run`. Two
benchmarks' smallest runs are already tests of the trainer tier, and are not run twice.
"""

from __future__ import annotations

import importlib.util
import re
import time
from dataclasses import dataclass, field

import pytest

from tests.factories import REPO_ROOT
from tests.support.scripts import run_script

BENCHMARKS = REPO_ROOT / "benchmarks"
NOT_SCRIPTS = {
    "trainer_trl_baseline.py": "one rank of trainer_vs_trl.py's TRL side, started by its launcher",
    "dpo_trl_baseline.py": "one rank of dpo_vs_trl.py's TRL side, started by its launcher",
    "gpu_batches.py": "gpu_acceptance.py's real batches and FLOP counts (tests/unit/test_gpu_batches.py)",
}
RUN_BY_THE_TRAINER_TIER = {  # the same code at the same size: running it here too would double its CI time
    "gpu_acceptance.py": "tests/trainer/test_gpu_acceptance_dry_run.py runs its --dry-run (= --smoke), row by row",
    "comm_bytes.py": "tests/trainer/test_metrics_comm_bytes.py runs its measure() and table() at ZeRO-2 and ZeRO-3",
}
TRL = importlib.util.find_spec("trl") is not None


@dataclass(frozen=True)
class Smoke:
    script: str
    rows: tuple[str, ...]
    """Patterns (multi-line mode) that each match one measured row of the table."""
    timeout: int = 300
    """Seconds the run may take: a ceiling for a loaded machine, far above its usual time."""
    args: tuple[str, ...] = ()
    marks: tuple[pytest.MarkDecorator, ...] = field(default=())


TRAINER = (pytest.mark.trainer,)
CLUSTER = (pytest.mark.cluster,)
SMOKES = [
    Smoke("planner_vs_published.py", (r"^Llama-3\.1-8B QLoRA .* \d+\.\d\dx ",), timeout=120),
    Smoke(
        "planner_vs_deepspeed.py",
        (r"^phi-3-mini +8 ZeRO-3 opt=cpu par=cpu +\d+\.\d\d +\d+\.\d\d +[+-]\d+\.\d\d%", r"^largest GPU-side .* \d"),
        timeout=300,
    ),
    Smoke(
        "planner_speed.py",
        (r"^llama-3\.1-70b full 32 GPUs seq 4096 +analytical +[1-9]\d* +\d", r"^tiny-llama lora .* traced +[1-9]"),
    ),
    Smoke("planner_traced_vs_analytical.py", (r"^tiny-llama +full +True +\d+\.\d +\d+\.\d +[+-]\d+\.\d%",)),
    Smoke(
        "planner_real_engines.py",
        (r"^llama-10m +lora +z2 opt=none par=none +\d+\.\d", r"^llama-10m +lora +z3 opt=cpu par=none +\d+\.\d"),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke(
        "planner_vs_cpu_peak.py",
        (r"^lora +on +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d, \d+\.\d\d +\d+\.\d\d",),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke(
        "rank_start.py",
        (
            r"^ +1 fresh +\d+\.\d +\d+\.\d$",
            r"^ +1 forked +\d+\.\d +\d+\.\d$",
            r"^forked / fresh: wall \d\.\d\dx, CPU \d\.\d\dx$",
        ),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke(
        "metrics_overhead.py",
        (r"^ZeRO-2 +[2-9] +\d+\.\d\d +\d+\.\d\d +\d+\.\d{3}", r"^per collective: bare \d"),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke(
        "trainer_vs_trl.py",
        (r"^reverse-words, packing on +\d+ +" + (r"\d+ +\d+\.\d\d" if TRL else r"- +-"),),
        timeout=600,
        args=() if TRL else ("--skip-trl",),  # the bench dependency group is not installed by bootstrap
        marks=TRAINER,
    ),
    Smoke(
        "dpo_vs_trl.py",
        (
            r"^ftjob +[1-9]\d* +\d+\.\d +[1-9]\d* +\d+\.\d\d +\d+\.\d{4}$",
            r"^TRL +[1-9]\d* +\d+\.\d +[1-9]\d* +\d+\.\d\d +\d+\.\d{4}$",
            r"^ratio ftjob/TRL: tokens/s \d+\.\d\d, peak memory \d+\.\d\d",
        ),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke(
        "planner_gpu/run_gpu_ground_truth.py",
        (
            r"^llama-tiny lora ZeRO-0 .* \d+\.\d\d +(CPU: -|\d+\.\d\d)",
            r"^llama-tiny full ZeRO-3 .* \d+\.\d\d +(CPU: -|\d)",
        ),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke(
        "apiserver_write_cost.py",
        (r"^  ClusterIO\.apply \(read\+apply\) +client +\d", r"^raw REST / generated client, writer CPU: +\d+\.\d\d$"),
        timeout=600,
        marks=CLUSTER,
    ),
    Smoke(
        "operator_scale.py",
        (
            r"^floor +apply → StatefulSet p50 +\d+\.\d\ds p99 +\d+\.\d\ds +\(n=3,",
            r"^operator +apply → StatefulSet p50 .*\(n=3,.* apply → Running p50 .*\(n=3\)$",
            r"^operator / floor, burst start → last StatefulSet: \d+\.\d\dx$",
            r"^idle with 4 running jobs: RSS max [1-9]\d* MiB",
        ),
        timeout=600,
        marks=CLUSTER,
    ),
    Smoke("data_prepare.py", (r"^each +\d+\.\d\d +-?\d+\.\d +[1-9]\d*$", r"^shared / each: CPU \d+\.\d\dx, private")),
    Smoke(
        "checkpoint_storage.py",
        (
            r"^\| tiny \| claim \| \d+\.\d\d \| 1\.00x \| \d+\.\d\d \| 1\.00x \|$",
            r"^\| tiny \| s3 \| \d+\.\d\d \| \d+\.\d\dx \| \d+\.\d\d \| \d+\.\d\dx \|$",
        ),
        timeout=600,
        marks=TRAINER,
    ),
    Smoke("cpu_precision.py", (r"^fp32 +2 +\d+\.\d$", r"^bf16 +2 +\d+\.\d$", r"^bf16 / fp32: \d+\.\d\dx$")),
    Smoke(
        "optimizer_step_memory.py",
        (
            r"^fused +\d+ +\d+\.\d\d +\d+\.\d +1\.00x$",
            r"^foreach +\d+ +\d+\.\d\d +\d+\.\d +\d+\.\d\dx$",
            r"^single-tensor +\d+ +\d+\.\d\d +\d+\.\d +\d+\.\d\dx$",
        ),
        timeout=120,
    ),
]


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.rglob("*.py")} - set(NOT_SCRIPTS)
    assert scripts == {s.script for s in SMOKES} | set(RUN_BY_THE_TRAINER_TIER)


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.parametrize(
    "smoke",
    [pytest.param(s, id=s.script.removesuffix(".py"), marks=[*s.marks, pytest.mark.timeout(s.timeout + 30)])
     for s in SMOKES],
)  # fmt: skip
def test_smoke_run_prints_its_table(smoke: Smoke, wall_times: dict[str, float]) -> None:
    started = time.monotonic()
    done = run_script([smoke.script, "--smoke", *smoke.args], smoke.timeout)
    wall_times[smoke.script] = time.monotonic() - started
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    missing = [row for row in smoke.rows if not re.search(row, done.stdout, re.MULTILINE)]
    assert not missing, f"rows not in the output: {missing}\n{done.stdout[-3000:]}"
