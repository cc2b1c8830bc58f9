"""A benchmark whose measurement failed exits non-zero, promptly, and prints no figures.

The failures are the ones that went unnoticed: a floor whose writes all failed waited out
its deadline and would have printed the percentiles of whatever jobs made it; a rank that
died left the engine benchmark blocked on its queue for ten minutes.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from benchmarks.operator_scale import Burst, MeasurementFailed
from benchmarks.planner_real_engines import RankFailed, collect
from tests.support.scripts import run_script


def burst(to_sts: int, to_run: int) -> Burst:
    return Burst([1.0] * to_sts, [2.0] * to_run, 3.0, 0.5, {}, {})


@pytest.mark.parametrize(
    ("sts", "run", "until_running", "message"),
    [
        (0, 0, False, "0 of 3 jobs got a StatefulSet within 600 s"),
        (2, 0, False, "2 of 3 jobs got a StatefulSet"),
        (3, 2, True, "2 of 3 jobs reached Running"),
    ],
)
def test_an_incomplete_burst_is_no_measurement(sts: int, run: int, until_running: bool, message: str) -> None:
    with pytest.raises(MeasurementFailed, match=message):
        burst(sts, run).require_complete("floor", 3, until_running=until_running, timeout=600)


def test_a_complete_burst_is_a_measurement() -> None:
    floor, operator = burst(3, 0), burst(3, 3)
    floor.require_complete("floor", 3, until_running=False, timeout=600)  # raises MeasurementFailed if not
    operator.require_complete("operator", 3, until_running=True, timeout=600)
    assert "apply → StatefulSet p50   1.00s p99   1.00s   (n=3," in floor.line("floor")
    assert "apply → Running p50   2.00s p99   2.00s (n=3)" in operator.line("operator")


@pytest.mark.timeout(60)
def test_a_rank_that_dies_ends_the_wait_at_once() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    hung, died = context.Process(target=time.sleep, args=(120,)), context.Process(target=os._exit, args=(3,))
    ranks = [hung, died]  # one rank died; its peer waits in a collective that never completes
    for rank in ranks:
        rank.start()
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"exit codes \[None, 3\]"):
        collect(results, ranks, timeout=600)
    assert time.monotonic() - started < 30
    for rank in ranks:
        rank.join()


@pytest.mark.bench
@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.timeout(630)
def test_a_smoke_run_whose_ranks_fail_exits_non_zero_without_rows(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dataset.jsonl")
    done = run_script(["planner_vs_cpu_peak.py", "--smoke", "--dataset", missing, "--format", "alpaca"], 600)
    assert done.returncode != 0
    assert "the run failed" in done.stderr, done.stderr[-3000:]
    assert not [line for line in done.stdout.splitlines() if line.startswith("lora ")], done.stdout
