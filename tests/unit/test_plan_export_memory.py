"""The final export's host memory is planned: the pod requests it and a limit below it is refused.

A full fine-tune gathers the whole model into rank 0's RAM before writing it, and a merged export
loads the unquantised base there; neither was counted, so a job could train for days and be
OOM-killed while saving its result (issue 42, defect 7).
"""

from __future__ import annotations

from typing import Any

import pytest

from finetune_operator.plan import DoesNotFitError, plan_job
from finetune_operator.plan.workload import GIB, HOST_BASELINE_PER_RANK
from tests.factories import make_job


def spec(method: str, *, merged: bool = False, host_memory: str | None = None) -> Any:
    resources: dict[str, Any] = {"numNodes": 2, "gpusPerNode": 8, "gpuMemory": "80Gi"}
    if host_memory is not None:
        resources["memory"] = host_memory
    return make_job(
        model={"uri": "org/model", "architecture": "llama-3.1-8b"},
        method={"type": method},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": 2048},
        resources=resources,
        output={"uri": "pvc://out/job", "mergedModel": merged},
    ).spec


@pytest.mark.parametrize(
    ("method", "merged", "whole_model", "adapter"),
    [
        ("full", False, True, False),
        ("lora", False, False, True),
        ("lora", True, True, True),
        ("qlora", True, True, True),
    ],
    ids=["full", "adapter", "lora-merged", "qlora-merged"],
)
def test_the_final_export_is_in_the_host_memory_each_pod_requests(
    method: str, merged: bool, whole_model: bool, adapter: bool
) -> None:
    result = plan_job(spec(method, merged=merged))
    assert result.chosen is not None
    counts = result.workload.counts
    export = (counts.total * 2 if whole_model else 0) + (counts.trainable * 2 if adapter else 0)
    memory = result.chosen.memory
    assert memory.export_host_bytes == export
    status = result.to_status()  # what the pods request (`render.workers._resources`)
    assert status.host_bytes_per_node == memory.host_bytes_per_node + export
    if whole_model:  # 16 GB of an 8B model's weights on top of eight ranks' baseline
        assert status.host_bytes_per_node >= 8 * HOST_BASELINE_PER_RANK + counts.total * 2


def test_a_pod_memory_that_fits_training_but_not_the_export_is_refused_with_advice() -> None:
    steady = plan_job(spec("lora")).chosen
    assert steady is not None
    limit = f"{(steady.memory.host_bytes_per_node + GIB) // 2**20}Mi"  # training fits with 1 GiB to spare
    assert plan_job(spec("lora", host_memory=limit)).chosen is not None
    with pytest.raises(DoesNotFitError) as refused:
        plan_job(spec("lora", merged=True, host_memory=limit))
    message = str(refused.value)
    assert "the final export needs 15." in message and "output.mergedModel: false" in message, message
    explained = plan_job(spec("lora", merged=True, host_memory=limit), require_fit=False).candidates
    assert any("with the final export's 15." in c.reason for c in explained if c.fits_gpu)
