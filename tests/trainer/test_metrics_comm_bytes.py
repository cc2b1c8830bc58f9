"""The bytes the trainer reports for one optimizer step, against DeepSpeed's behaviour and the planner.

Two real gloo ranks train the demo model under ZeRO-2 and ZeRO-3 (benchmarks/comm_bytes.py
does the work and prints the table). What DeepSpeed 0.19 really does is asserted exactly;
the planner's `comm.bytes_per_step` is compared within 10 %: exact at ZeRO-2; at ZeRO-3 the
tiny model gathers ~13 % more than one gather per pass, which is not explained yet, so
that case is a strict xfail that turns red the day it is fixed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.comm_bytes import FP32, StageResult, measure, table

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(600)]

RING = 0.5  # (n - 1) / n for 2 ranks


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, StageResult]:
    root = tmp_path_factory.mktemp("comm-bytes")
    out = {stage: measure(stage, Path(root) / f"zero{stage}") for stage in (2, 3)}
    print(table(list(out.values())))
    return out


def test_zero2_reduces_gradients_by_all_reduce_and_gathers_once(results: dict[int, StageResult]) -> None:
    r = results[2]
    grads = FP32 * r.trainable
    assert r.measured["all_reduce"] == pytest.approx(2 * RING * grads, rel=0.001)  # + a few scalars
    assert r.measured["all_gather"] == pytest.approx(RING * grads, rel=0.001)
    assert r.measured.get("reduce_scatter", 0.0) == 0.0


def test_zero3_reduce_scatters_gradients_and_gathers_only_partitioned_parameters(
    results: dict[int, StageResult],
) -> None:
    r = results[3]
    assert r.measured["reduce_scatter"] == pytest.approx(RING * FP32 * r.trainable, rel=0.001)
    gathered_only = r.model_gathered_only["all_gather"]
    assert gathered_only <= r.measured["all_gather"] <= 1.2 * gathered_only


@pytest.mark.parametrize(
    "stage",
    [
        2,
        pytest.param(
            3,
            marks=pytest.mark.xfail(
                strict=True, reason="ZeRO-3 gathers ~13% more than once per pass on the tiny model (unexplained)"
            ),
        ),
    ],
)
def test_planner_model_within_ten_percent(results: dict[int, StageResult], stage: int) -> None:
    r = results[stage]
    model_total = sum(r.model[op] for op in ("all_reduce", "reduce_scatter", "all_gather"))
    assert r.total_bus() == pytest.approx(model_total, rel=0.10)
