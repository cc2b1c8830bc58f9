"""The bytes the trainer reports for one optimizer step, against DeepSpeed's behaviour and the planner.

Two real gloo ranks train the demo model under ZeRO-2 and ZeRO-3 (benchmarks/comm_bytes.py
does the work and prints the table). What DeepSpeed 0.19 really does is asserted exactly;
the planner's `comm.bytes_per_step` is compared within 10 % (the issue's bar; both stages
measure exact today).
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


def test_zero3_reduce_scatters_gradients_and_gathers_each_pass_plus_persistent_once(
    results: dict[int, StageResult],
) -> None:
    r = results[3]
    assert r.measured["reduce_scatter"] == pytest.approx(RING * FP32 * r.trainable, rel=0.001)
    # forward + backward gather the partitioned parameters; after the optimizer step
    # DeepSpeed gathers the persistent (small, whole-on-every-rank) parameters once
    assert r.persistent_bytes > 0 and r.unused_bytes > 0  # the demo model has both kinds
    assert r.measured["all_gather"] == pytest.approx(RING * (2 * r.gathered_bytes + r.persistent_bytes), rel=0.001)


@pytest.mark.parametrize("stage", [2, 3])
def test_planner_model_within_ten_percent(results: dict[int, StageResult], stage: int) -> None:
    r = results[stage]
    model_total = sum(r.model[op] for op in ("all_reduce", "reduce_scatter", "all_gather"))
    assert r.total_bus() == pytest.approx(model_total, rel=0.10)
