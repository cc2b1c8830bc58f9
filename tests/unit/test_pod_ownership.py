"""Only pods the job's StatefulSet owns decide a job (issue 18, item 2).

Anyone who may create a pod in the namespace can put `finetune.dev/job-name` on it. Such a
pod, not owned by the job's StatefulSet (ownerReferences, matched by uid), must not turn the
job Succeeded or Failed, must not trigger a gang restart, and must never be deleted.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from finetune_operator.api.reasons import State
from finetune_operator.reconcile.lifecycle import decide
from finetune_operator.reconcile.observed import Observed, owned, pod_view, workers_view
from tests.support.cluster import FakeCluster, reconciler_on, stored_job
from tests.support.lifecycle import HASH, NOW, exited, frugal, job_with, planner, pod, step

JOB_UID = "job-uid"
STS_UID = "sts-uid"


def statefulset(owner: str | None = JOB_UID, name: str = "job", config_hash: str = HASH) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": STS_UID}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "FineTuneJob", "uid": owner, "controller": True, "name": name}]
    return {
        "metadata": meta,
        "spec": {"replicas": 2, "template": {"metadata": {"annotations": {"finetune.dev/config-hash": config_hash}}}},
    }


def owned_by(body: dict[str, Any], uid: str | None = STS_UID, controller: bool = True) -> dict[str, Any]:
    body = copy.deepcopy(body)
    if uid is not None:
        body["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "uid": uid, "controller": controller}]
    return body


def observed(job_uid: str, sts: dict[str, Any], pods: list[dict[str, Any]], name: str = "job") -> Observed:
    workers = workers_view(sts)
    assert workers is not None
    return owned(name, job_uid, [workers], [pod_view(p) for p in pods])


def decide_on(obs: Observed) -> Any:
    job, _ = step(job_with(), [])
    return decide(job, obs, NOW, planner=planner, replanner=frugal, desired_config_hash=lambda _p: HASH)


SUMMARY = json.dumps({"finalLoss": 0.1, "steps": 1, "tokens": 1, "adapterUri": "/out/forged"})


def test_foreign_pods_reporting_success_do_not_succeed_the_job() -> None:
    done = [pod(0, last=exited(0, SUMMARY, "Completed")), pod(1, state={"terminated": exited(0)})]
    real = decide_on(observed(JOB_UID, statefulset(), [owned_by(p) for p in done]))
    assert real.status.state == State.SUCCEEDED  # the same pods, owned: the scenario is a real success
    for foreign in (
        done,  # no ownerReference at all
        [owned_by(p, uid="other-sts") for p in done],  # owned by another StatefulSet
        [owned_by(p, controller=False) for p in done],  # a non-controller reference
    ):
        decision = decide_on(observed(JOB_UID, statefulset(), foreign))
        assert decision.status.state != State.SUCCEEDED and decision.status.result is None


def test_a_foreign_pod_copying_the_config_hash_does_not_fail_the_job() -> None:
    line = "DataError: /data/d.jsonl:7: malformed alpaca record (rank 0)"
    pods = [pod(0, state={"terminated": exited(1, line)}), pod(1)]
    assert decide_on(observed(JOB_UID, statefulset(), [owned_by(p) for p in pods])).status.state == State.FAILED
    decision = decide_on(observed(JOB_UID, statefulset(), pods))
    assert decision.status.state != State.FAILED and decision.status.last_failure is None


def test_a_foreign_pod_without_the_hash_triggers_no_restart() -> None:
    stale = pod(0, config_hash="not-ours")
    assert decide_on(observed(JOB_UID, statefulset(), [owned_by(stale)])).delete_pods
    decision = decide_on(observed(JOB_UID, statefulset(), [stale]))
    assert not decision.delete_pods and decision.status.restarts == 0


def test_a_statefulset_the_job_does_not_control_is_not_its_workers() -> None:
    pods = [owned_by(pod(0)), owned_by(pod(1))]
    assert observed(JOB_UID, statefulset(), pods).workers is not None
    for sts, name in ((statefulset(owner=None), "job"), (statefulset(owner="x"), "job"), (statefulset(), "other")):
        view = observed(JOB_UID, sts, pods, name=name)
        assert view.workers is None and view.pods == ()
    assert observed("", statefulset(owner=None), pods).workers is None  # an unknown job uid matches nothing


def test_a_gang_restart_deletes_only_owned_pods_by_name_and_uid() -> None:
    store = FakeCluster(stored_job(uid=JOB_UID))
    reconciler = reconciler_on(store)
    reconciler.reconcile(store.job(), Observed(workers=None))
    failing = owned_by(pod(0, config_hash="old", state={"terminated": exited(1, "boom")}))
    foreign = pod(5, config_hash="old")  # the user's own pod, labelled for the job
    workers = workers_view(statefulset(config_hash="old"))
    assert workers is not None
    obs = owned("job", JOB_UID, [workers], [pod_view(p) for p in (failing, foreign)])
    reconciler.reconcile(store.job(), obs)
    assert store.deleted_pods, "the gang was not restarted"
    assert all(batch == [(failing["metadata"]["name"], failing["metadata"]["uid"])] for batch in store.deleted_pods)
