"""A pass decided on a body that lags the operator's own status write must not re-render the gang.

The cluster tier caught this only by timing (`test_out_of_memory_replans_and_restarts` read the
pre-OOM plan back from the ConfigMap once); here the interleaving is forced. The store below
stands in for the apiserver's job object only as far as the Reconciler uses it: resourceVersion
bumps and 409s on a stale one. Everything else (decide, plan, render, hashes) is the real code.
"""

from __future__ import annotations

import copy
import json
from typing import Any, cast

from finetune_operator.reconcile.cluster_io import ClusterIO, Conflict
from finetune_operator.reconcile.observed import observe
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document
from tests.unit.test_lifecycle import exited, pod


class JobStore:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body, self.applied, self.reads = body, [], 0  # type: ignore[var-annotated]

    def apply(self, objects: Any, owner_uid: str) -> None:
        self.applied.append(list(objects))

    def claim_access_modes(self, namespace: str, claim: str) -> tuple[str, ...] | None:
        return ("ReadWriteMany",)

    def delete_pods(self, namespace: str, pods: Any) -> None:
        pass

    def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        return copy.deepcopy(self.body)

    def patch_status(self, namespace: str, name: str, rv: str | None, patch: dict[str, Any]) -> str:
        if rv != self.body["metadata"]["resourceVersion"]:
            raise Conflict("stale")
        status = {**(self.body.get("status") or {}), **patch}
        self.body["status"] = {k: v for k, v in status.items() if v is not None}
        self.body["metadata"]["resourceVersion"] = str(int(rv) + 1)
        return str(self.body["metadata"]["resourceVersion"])


def _plan_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    return dict(json.loads(config["data"]["plan.json"]))


def _sts(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "StatefulSet")


def test_a_stale_body_after_a_replan_does_not_put_the_old_plan_back() -> None:
    doc = job_document(resources={"numNodes": 2, "gpusPerNode": 8})
    doc["metadata"].update({"uid": "u1", "resourceVersion": "1", "generation": 1})
    store = JobStore(doc)
    reconciler = Reconciler(cast(ClusterIO, store), RenderOptions(trainer_image="t"), lambda *_: None)

    reconciler.reconcile(store.read_job("", ""), observe(None, []))  # first pass: children, status
    first = store.applied[-1]
    old_hash = _sts(first)["spec"]["template"]["metadata"]["annotations"]["finetune.dev/config-hash"]
    running_body = store.read_job("", "")  # what a lagging cache still holds after the re-plan below
    oom = [pod(0, config_hash=old_hash, state={"terminated": exited(137, "", "OOMKilled")}),
           pod(1, config_hash=old_hash)]  # fmt: skip
    reconciler.reconcile(store.read_job("", ""), observe(_sts(first), oom))
    replanned = store.applied[-1]
    assert _plan_of(replanned)["replans"] == 1
    new_hash = _sts(replanned)["spec"]["template"]["metadata"]["annotations"]["finetune.dev/config-hash"]
    assert new_hash != old_hash

    applies, reads = len(store.applied), store.reads
    # the old gang is deleted and the new one not created yet; the pass is decided on the stale body
    reconciler.reconcile(running_body, observe(_sts(replanned), []))
    assert store.reads == reads + 1, "a pass that would re-render running workers reads the job first"
    assert all(_plan_of(objs)["replans"] == 1 for objs in store.applied[applies:]), "the old plan came back"
    assert len(store.applied) == applies, "nothing needed applying once decided on the newest job"
