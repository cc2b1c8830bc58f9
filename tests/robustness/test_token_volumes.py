"""A tenant cannot hand the trainer pods an apiserver token through `spec.podTemplate`.

Trainer pods run with `automountServiceAccountToken: false`. A projected `serviceAccountToken`
volume would mount one anyway, for the job's `objectStorage.serviceAccountName` or the
namespace's default account. The real apiserver stores such a job (its volumes are free-form);
the operator, with the chart's default policy, fails it with `InvalidSpec` naming the volume,
before any pod or StatefulSet exists.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from finetune_localcluster import Kube
from finetune_localcluster.devtools import OperatorProcess
from tests.cluster.operator_harness import Jobs

SPEC: dict[str, Any] = {"model": {"uri": "builtin://tiny-llama"}, "dataset": {"uri": "/data/train.jsonl"},
        "output": {"uri": "/output/job"}, "training": {"maxSteps": 10},
        "resources": {"numNodes": 1, "gpusPerNode": 1, "gpuMemory": "80Gi"}}  # fmt: skip
TOKEN = {"serviceAccountToken": {"path": "token", "audience": "vault"}}
SHAPES: list[list[dict[str, Any]]] = [
    [{"name": "t", "projected": {"sources": [TOKEN]}}],
    [{"name": "c", "configMap": {"name": "c"}}, {"name": "t", "projected": {"sources": [{"configMap": {"name": "c"}},
                                                                                        TOKEN]}}],
    [{"name": "t", "projected": {"sources": [TOKEN, {**TOKEN, "serviceAccountToken": {"path": "second"}}]}}],
]  # fmt: skip


@pytest.fixture
def ns(robust_kube: Kube) -> Iterator[str]:
    name = f"tok-{secrets.token_hex(4)}"
    robust_kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    robust_kube.delete(f"/api/v1/namespaces/{name}")


@pytest.mark.slow
def test_projected_tokens_fail_the_job_before_any_pod(
    robust_kube: Kube, robust_operator: OperatorProcess, ns: str
) -> None:
    jobs = Jobs(robust_kube, ns)
    for index, volumes in enumerate(SHAPES):
        jobs.create(f"tok-{index}", **SPEC, objectStorage={"serviceAccountName": "trainer"},
                    podTemplate={"volumes": volumes})  # fmt: skip
    tokens = refused = 0
    for index, volumes in enumerate(SHAPES):
        failed = jobs.wait_state("Failed", name=f"tok-{index}")
        text = str(failed)
        found = sum(1 for v in volumes for s in v.get("projected", {}).get("sources", []) if "serviceAccountToken" in s)
        tokens += found
        refused += len(
            set(re.findall(r"volumes\[\d+\]\.projected\.sources\[\d+\]\.serviceAccountToken: a projected", text))
        )
        assert "InvalidSpec" in text and "operator.policy.allowServiceAccountTokenVolumes" in text, text
        assert jobs.statefulset(f"tok-{index}") is None and jobs.pods(f"tok-{index}") == []
    print(f"{tokens} projected tokens in {len(SHAPES)} jobs: {refused} refused, 0 pods created")
    assert refused == tokens == 4
