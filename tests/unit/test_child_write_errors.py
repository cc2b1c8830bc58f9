"""A child the operator cannot write becomes a condition on the job (issue 18, item 3).

Before, any error from applying a child escaped `reconcile` as an exception: the job never
got a status, and the work queue retried it forever with a traceback. The cluster below
refuses the apply the way the apiserver does (its real behaviour is in the cluster tier);
everything else is the real Reconciler.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from finetune_operator.reconcile.cluster_io import NOT_OURS, ChildWriteError
from finetune_operator.reconcile.decision import Event
from finetune_operator.reconcile.observed import Observed
from tests.support.cluster import FakeCluster, reconciler_on, stored_job


class RefusingCluster(FakeCluster):
    """Every apply raises `error` (None: applies are accepted)."""

    def __init__(self, body: dict[str, Any], error: ChildWriteError | None) -> None:
        super().__init__(body)
        self.error = error

    def apply(self, objects: Iterable[dict[str, Any]], owner_uid: str) -> None:
        super().apply(objects, owner_uid)
        if self.error is not None:
            raise self.error


def reconcile_with(error: ChildWriteError | None, passes: int = 1) -> tuple[RefusingCluster, list[Event]]:
    cluster = RefusingCluster(stored_job(uid="job-uid"), error)
    events: list[Event] = []
    reconciler = reconciler_on(cluster, lambda _b, e: events.append(e))
    for _ in range(passes):
        reconciler.reconcile(cluster.job(), Observed(workers=None), apply_all=True)
    return cluster, events


def condition(cluster: RefusingCluster, kind: str) -> dict[str, Any]:
    return next(c for c in cluster.body["status"]["conditions"] if c["type"] == kind)


def test_a_foreign_object_of_a_childs_name_is_a_condition_naming_it() -> None:
    conflict = ChildWriteError("ConfigMap", "job-config", None, NOT_OURS, conflict=True)
    cluster, events = reconcile_with(conflict, passes=3)
    assert cluster.owner_uids == ["job-uid"] * 3  # the job's uid goes with every apply: what ownership is checked on
    running = condition(cluster, "Running")
    assert running["status"] == "False" and running["reason"] == "ChildConflict"
    assert "ConfigMap job-config" in running["message"] and "delete it or rename the job" in running["message"]
    assert cluster.body["status"]["state"] == "Planned"  # waits: deleting the object lets it proceed
    assert [e.reason for e in events].count("ChildConflict") == 1  # one warning, not one per pass
    cluster.error = None
    reconciler = reconciler_on(cluster)
    reconciler.reconcile(cluster.job(), Observed(workers=None), apply_all=True)
    assert condition(cluster, "Running")["reason"] == "WaitingForWorkers"


@pytest.mark.parametrize("code", [400, 413, 422])
def test_a_child_the_apiserver_refuses_fails_the_job_with_its_message(code: int) -> None:
    message = 'StatefulSet.apps "job" is invalid: spec.template.spec.containers[0].env[3].name: Duplicate value'
    cluster, events = reconcile_with(ChildWriteError("StatefulSet", "job", code, message))
    failed = condition(cluster, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "StatefulSet job" in failed["message"] and "Duplicate value" in failed["message"]
    assert cluster.body["status"]["state"] == "Failed" and "InvalidSpec" in [e.reason for e in events]


def test_an_apiserver_that_does_not_answer_is_said_and_retried() -> None:
    cluster, _ = reconcile_with(ChildWriteError("Service", "job-workers", 503, "etcdserver: request timed out"))
    running = condition(cluster, "Running")
    assert running["reason"] == "ChildWriteFailed" and "etcdserver: request timed out" in running["message"]
    assert cluster.body["status"]["state"] == "Planned"


def test_a_queued_job_on_a_cluster_without_kueue_says_so() -> None:
    """spec.queueName on a cluster that does not serve Kueue's Workload API: the apply of the
    Workload answers 404, and the job says that Kueue is missing and what to do, instead of a bare
    "404 Not Found" under a Queued condition that waits forever."""

    class NoKueue(RefusingCluster):
        def apply(self, objects: Iterable[dict[str, Any]], owner_uid: str) -> None:
            if any(o["kind"] == "Workload" for o in objects):
                raise ChildWriteError("Workload", "job", 404, "Not Found")

    cluster = NoKueue(stored_job(uid="job-uid", queueName="team-a"), None)
    reconciler = reconciler_on(cluster)
    reconciler.reconcile(cluster.job(), Observed(workers=None), apply_all=True)
    running = condition(cluster, "Running")
    assert running["reason"] == "ChildWriteFailed", running
    assert "does not serve Kueue's Workload API" in running["message"] and "spec.queueName" in running["message"]
    assert condition(cluster, "Queued")["status"] == "True"
