"""Scenario builders for the lifecycle decision, without a cluster.

A 2×8 job (`job_with`), pod bodies as the apiserver reports them (`pod`, `exited`), and one
`decide` pass on them with the fixed planner (`run`, `step`). All scenarios happen at `NOW`
and every pod carries the config hash `HASH` unless told otherwise.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from finetune_operator.api import FineTuneJob
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import FineTuneJobStatus, PlanStatus
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.reconcile.decision import Decision
from finetune_operator.reconcile.lifecycle import decide
from finetune_operator.reconcile.observed import observe
from tests.factories import job_document

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
HASH = "h1"


def ts(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    ordinal: int,
    *,
    ready: bool = True,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    config_hash: str = HASH,
    created: datetime = NOW - timedelta(minutes=5),
    deleting: bool = False,
) -> dict[str, Any]:
    """A worker pod's body: running and ready unless `state`/`ready` say otherwise; `last` is
    the trainer container's previous termination."""
    meta: dict[str, Any] = {
        "name": f"job-{ordinal}",
        "uid": f"uid-{ordinal}-{created.timestamp():.0f}",
        "labels": {"apps.kubernetes.io/pod-index": str(ordinal)},
        "annotations": {"finetune.dev/config-hash": config_hash},
        "creationTimestamp": ts(created),
    }
    if deleting:
        meta["deletionTimestamp"] = ts(NOW)
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "podIP": f"127.2.0.{ordinal + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "restartCount": restarts,
                    "state": state or {"running": {}},
                    "lastState": {"terminated": last} if last else {},
                }
            ],
        },
    }


def exited(code: int, message: str = "", reason: str = "Error", at: datetime = NOW) -> dict[str, Any]:
    """A container's `terminated` state."""
    return {"exitCode": code, "reason": reason, "message": message, "finishedAt": ts(at)}


def planner(spec: FineTuneJobSpec) -> PlanStatus:
    return fixed_plan(spec)


def frugal(spec: FineTuneJobSpec, plan: PlanStatus) -> PlanStatus | None:
    """A re-planner that only raises the ZeRO stage (None past ZeRO-3)."""
    if plan.zero_stage >= 3:
        return None
    return plan.model_copy(update={"zero_stage": plan.zero_stage + 1})


def job_with(status: FineTuneJobStatus | None = None, generation: int = 1, **spec: Any) -> FineTuneJob:
    """A 2-node × 8-GPU job (uid `job-uid`) with the spec deep-merged with `spec`."""
    doc = job_document(resources={"numNodes": 2, "gpusPerNode": 8}, **spec)
    doc["metadata"].update({"uid": "job-uid", "generation": generation})
    job = FineTuneJob.from_manifest(doc)
    return job.model_copy(update={"status": status}) if status else job


def run(job: FineTuneJob, pods: list[dict[str, Any]], sts: bool = True, now: datetime = NOW, **kw: Any) -> Decision:
    """One decision on `pods` (under a 2-replica StatefulSet unless `sts` is False)."""
    observed = observe({"spec": {"replicas": 2}} if sts else None, pods)
    return decide(
        job,
        observed,
        now,
        planner=kw.pop("planner", planner),
        replanner=kw.pop("replanner", frugal),
        desired_config_hash=lambda _p: HASH,
        **kw,
    )


def step(job: FineTuneJob, pods: list[dict[str, Any]], **kw: Any) -> tuple[FineTuneJob, Decision]:
    """`run`, and the job as its status write would leave it."""
    decision = run(job, pods, **kw)
    return job.model_copy(update={"status": decision.status}), decision


def reasons(decision: Decision) -> list[str]:
    """The reasons of the decision's Events, in order."""
    return [e.reason for e in decision.events]
