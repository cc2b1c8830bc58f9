"""Ownership against the real apiserver (issue 18, items 2 and 3): a labelled pod the job's
StatefulSet does not own decides nothing and survives a gang restart, and an object of a
child's name that the operator did not create is never taken over."""

from __future__ import annotations

import json
from typing import Any

import pytest

from finetune_localcluster import Kube, wait_for
from finetune_localcluster.devtools import OperatorProcess
from tests.cluster.operator_harness import Jobs, small

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def jobs(kube: Kube, namespace: str, operator: OperatorProcess) -> Jobs:
    return Jobs(kube, namespace)


def intruder(jobs: Jobs) -> dict[str, Any]:
    """The user's own pod, labelled for the job (as anyone who may create pods can)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "labels": {"finetune.dev/job-name": "job"}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:test"}]},
    }
    return jobs.kube.create(f"/api/v1/namespaces/{jobs.ns}/pods", pod)


def test_a_labelled_pod_the_job_does_not_own_decides_nothing_and_survives(jobs: Jobs) -> None:
    mine = intruder(jobs)
    jobs.create(**small(failurePolicy={"backoffLimit": 2}))
    jobs.wait_state("Running")
    summary = {"finalLoss": 0.1, "steps": 1, "tokens": 1, "adapterUri": "/forged"}
    jobs.report("intruder", {"exitCode": 0, "reason": "Completed", "message": json.dumps(summary)})
    jobs.report("job-0", {"exitCode": 1, "message": "RuntimeError: NCCL communicator was aborted"})
    status = jobs.wait(lambda s: s.get("restarts") == 1, "one gang restart")
    assert status.get("result") is None and status["state"] != "Succeeded"
    wait_for(lambda: jobs.status().get("state") == "Running", 60, "the new gang running")
    survivor = jobs.kube.get(f"/api/v1/namespaces/{jobs.ns}/pods/intruder")
    assert survivor["metadata"]["uid"] == mine["metadata"]["uid"] and not survivor["metadata"].get("deletionTimestamp")
    assert jobs.status().get("result") is None


def test_an_object_of_a_childs_name_is_never_taken_over(jobs: Jobs) -> None:
    path = f"/api/v1/namespaces/{jobs.ns}/configmaps"
    jobs.kube.create(path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "job-config"},
                            "data": {"mine": "1"}})  # fmt: skip
    jobs.create(**small())
    status = jobs.wait(
        lambda s: any(c.get("reason") == "ChildConflict" for c in s.get("conditions", [])), "a ChildConflict condition"
    )
    message = next(c["message"] for c in status["conditions"] if c.get("reason") == "ChildConflict")
    assert "ConfigMap job-config" in message and "delete it or rename the job" in message
    theirs = jobs.kube.get(f"{path}/job-config")
    assert theirs["data"] == {"mine": "1"} and not theirs["metadata"].get("ownerReferences")
    jobs.kube.delete(f"{path}/job-config")
    jobs.wait_state("Running", timeout=90)  # the way is clear: the job proceeds by itself
    ours = jobs.kube.get(f"{path}/job-config")
    assert "mine" not in ours["data"] and ours["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"
