"""A pass decided on a body that lags the operator's own status write must not re-render the gang.

The cluster tier caught this only by timing (`test_out_of_memory_replans_and_restarts` read the
pre-OOM plan back from the ConfigMap once); here the interleaving is forced on the in-memory
cluster of `tests.support.cluster` (resourceVersion bumps, 409s on a stale one). Everything else
(decide, plan, render, hashes) is the real code.
"""

from __future__ import annotations

from finetune_operator.reconcile.observed import observe
from tests.support.cluster import FakeCluster, config_hash_of, plan_of, reconciler_on, statefulset_of, stored_job
from tests.support.lifecycle import exited, pod


def test_a_stale_body_after_a_replan_does_not_put_the_old_plan_back() -> None:
    store = FakeCluster(stored_job())
    reconciler = reconciler_on(store)

    reconciler.reconcile(store.job(), observe(None, []))  # first pass: children, status
    first = store.applied[-1]
    old_hash = config_hash_of(statefulset_of(first))
    running_body = store.job()  # what a lagging cache still holds after the re-plan below
    oom = [pod(0, config_hash=old_hash, state={"terminated": exited(137, "", "OOMKilled")}),
           pod(1, config_hash=old_hash)]  # fmt: skip
    reconciler.reconcile(store.job(), observe(statefulset_of(first), oom))
    replanned = store.applied[-1]
    assert plan_of(replanned)["replans"] == 1
    new_hash = config_hash_of(statefulset_of(replanned))
    assert new_hash != old_hash

    applies, reads = len(store.applied), store.reads
    # the old gang is deleted and the new one not created yet; the pass is decided on the stale body
    reconciler.reconcile(running_body, observe(statefulset_of(replanned), []))
    assert store.reads == reads + 1, "a pass that would re-render running workers reads the job first"
    assert all(plan_of(objs)["replans"] == 1 for objs in store.applied[applies:]), "the old plan came back"
    assert len(store.applied) == applies, "nothing needed applying once decided on the newest job"
