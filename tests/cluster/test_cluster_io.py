"""KubernetesClusterIO's status write against the real apiserver: what each refusal becomes.

A pass that raced the job's deletion gets 404 on the status subresource. That is `JobGone` (a
`Conflict`: the pass ends quietly), never an exception that the work queue retries with a
traceback (the robustness tier's admitted-documents test found it: it deletes each batch of jobs
while the operator is still deciding on them).
"""

from __future__ import annotations

from typing import Any

import pytest

from finetune_localcluster import Kube
from finetune_operator.reconcile.cluster_io import Conflict, JobGone, KubernetesClusterIO
from tests.cluster.operator_harness import JOBS, Jobs

pytestmark = pytest.mark.timeout(120)


def test_a_status_write_on_a_deleted_job_is_job_gone_and_a_stale_one_is_conflict(
    crd: dict[str, Any], kube: Kube, namespace: str, k8s_client: Any
) -> None:
    io = KubernetesClusterIO(k8s_client)
    job = Jobs(kube, namespace).create("gone")
    version = job["metadata"]["resourceVersion"]
    io.patch_status(namespace, "gone", version, {"state": "Pending"})
    with pytest.raises(Conflict) as stale:
        io.patch_status(namespace, "gone", version, {"state": "Planned"})
    assert not isinstance(stale.value, JobGone)
    kube.delete(f"{JOBS.format(ns=namespace)}/gone")
    with pytest.raises(JobGone):
        io.patch_status(namespace, "gone", None, {"state": "Planned"})
