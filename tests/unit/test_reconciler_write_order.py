"""A gang restart writes the counted failure before it deletes the failed pods.

An operator SIGKILLed between the two used to delete first: the new pods carried no trace of
the failure and the count was lost (the robustness tier's chaos test found it). Now the next
pass finds the failure already counted (its fingerprint) and only deletes; and a status write
that loses a conflict deletes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from finetune_operator.reconcile.cluster_io import Conflict, JobGone
from finetune_operator.reconcile.observed import observe
from finetune_operator.reconcile.runner import Reconciler
from tests.support.cluster import FakeCluster, config_hash_of, reconciler_on, statefulset_of, stored_job
from tests.support.lifecycle import exited, pod


class OrderedStore(FakeCluster):
    """Records the stored restart count at each gang deletion; `conflict` refuses status writes."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.deleted_with_restarts: list[int] = []
        self.conflict = False

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]]) -> None:
        self.deleted_with_restarts.append(int((self.body.get("status") or {}).get("restarts") or 0))

    def patch_status(self, namespace: str, name: str, resource_version: str | None, status: dict[str, Any]) -> str:
        if self.conflict:
            raise Conflict("someone else wrote first")
        return super().patch_status(namespace, name, resource_version, status)


def _running(store: OrderedStore) -> tuple[Reconciler, dict[str, Any], list[Any]]:
    reconciler = reconciler_on(store)
    reconciler.reconcile(store.job(), observe(None, []))
    sts = statefulset_of(store.applied[-1])
    config_hash = config_hash_of(sts)
    failed = [pod(0, config_hash=config_hash, state={"terminated": exited(1, "", "Error")}),
              pod(1, config_hash=config_hash)]  # fmt: skip
    return reconciler, sts, failed


def _store() -> OrderedStore:
    return OrderedStore(stored_job())


def test_the_failure_is_counted_in_the_stored_status_before_any_pod_is_deleted() -> None:
    store = _store()
    reconciler, sts, failed = _running(store)
    reconciler.reconcile(store.job(), observe(sts, failed))
    assert store.deleted_with_restarts == [1]
    # killed right after the deletion request: the next pass sees the same failure, counts nothing
    reconciler.reconcile(store.job(), observe(sts, failed))
    assert store.deleted_with_restarts == [1, 1]
    assert store.body["status"]["restarts"] == 1


def test_a_status_write_that_loses_a_conflict_deletes_no_pod() -> None:
    store = _store()
    reconciler, sts, failed = _running(store)
    store.conflict = True
    reconciler.reconcile(store.job(), observe(sts, failed))
    assert store.deleted_with_restarts == []
    store.conflict = False
    reconciler.reconcile(store.job(), observe(sts, failed))
    assert store.deleted_with_restarts == [1]


def test_a_job_deleted_during_a_pass_ends_the_pass_quietly() -> None:
    """The status write of a job deleted meanwhile answers 404: the pass ends, deletes no pod and
    raises nothing (it used to raise, and the work queue retried a job that no longer exists)."""
    store = _store()
    reconciler, sts, failed = _running(store)

    def gone(*_: Any) -> str:
        raise JobGone("default/tiny")

    store.patch_status = gone  # type: ignore[method-assign,assignment]
    outcome = reconciler.reconcile(store.job(), observe(sts, failed))
    assert not outcome.wrote_status and store.deleted_with_restarts == []


class DiesAtScaleDown(OrderedStore):
    """An operator SIGKILLed the moment it scales the workers to 0."""

    def apply(self, objects: Iterable[dict[str, Any]], owner_uid: str) -> None:
        batch = list(objects)
        if statefulset_of(batch)["spec"]["replicas"] == 0:
            raise SystemExit("killed")
        super().apply(batch, owner_uid)


def test_the_verdict_is_stored_before_the_finished_gang_is_scaled_away() -> None:
    """A finished gang's exit codes live only in its pods, which the scale-down deletes: an
    operator killed between the scale-down and the status write found neither, and the job never
    got its verdict (the chaos test found it). The verdict is stored first."""
    store = DiesAtScaleDown(stored_job())
    reconciler, sts, _ = _running(store)
    config_hash = config_hash_of(sts)
    summary = '{"finalLoss": 0.5, "steps": 10, "tokens": 100}'
    done = [pod(i, config_hash=config_hash, state={"terminated": exited(0, summary, "Completed")}) for i in (0, 1)]
    with pytest.raises(SystemExit):
        reconciler.reconcile(store.job(), observe(sts, done))
    assert store.body["status"]["state"] == "Succeeded", store.body["status"]
    # the restarted operator scales the gang down from the stored verdict alone (the pods are gone)
    restarted = reconciler_on(OrderedStore(store.body))
    outcome = restarted.reconcile(store.body, observe(sts, []))
    assert outcome.applied and outcome.decision is not None and outcome.decision.replicas == 0
