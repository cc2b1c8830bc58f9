"""Multi-node jobs need ReadWriteMany claims; pods' waiting reasons reach the job (issue 13, defect 4)."""

from __future__ import annotations

from typing import Any

import pytest

from finetune_operator.api import FineTuneJob
from finetune_operator.plan.admission.storage import SharedStorageError, check_shared_storage, written_claims
from finetune_operator.reconcile.decision import PlanFailed
from finetune_operator.reconcile.observed import observe, pod_view
from finetune_operator.reconcile.runner import plan_or_fail
from tests.factories import job_document
from tests.support.lifecycle import job_with, pod, run


def spec(nodes: int, **overrides: Any) -> Any:
    doc = job_document(resources={"numNodes": nodes, "gpusPerNode": 8}, **overrides)
    return FineTuneJob.from_manifest(doc).spec


def test_written_claims_are_the_output_and_the_model_cache() -> None:
    s = spec(2, model={"uri": "meta-llama/Llama-3.1-8B", "cache": {"claimName": "hf"}})
    assert written_claims(s) == {"out": "spec.output.uri", "hf": "spec.model.cache.claimName"}


def test_multi_node_on_read_write_once_is_refused_naming_claim_and_need() -> None:
    with pytest.raises(SharedStorageError) as err:
        check_shared_storage(spec(2), {"out": ("ReadWriteOnce",)})
    message = str(err.value)
    assert "spec.output.uri" in message and "'out'" in message and "ReadWriteMany" in message
    assert err.value.condition_reason == "InvalidSpec"


@pytest.mark.parametrize(
    ("nodes", "modes"),
    [(2, ("ReadWriteMany",)), (2, ("ReadWriteOnce", "ReadWriteMany")), (1, ("ReadWriteOnce",)), (2, None)],
)
def test_shareable_or_single_node_or_unknown_passes(nodes: int, modes: tuple[str, ...] | None) -> None:
    check_shared_storage(spec(nodes), {"out": modes})


def test_the_reconciler_planner_reads_the_modes_and_fails_invalid_spec() -> None:
    asked: list[str] = []

    def modes(claim: str) -> tuple[str, ...]:
        asked.append(claim)
        return ("ReadWriteOnce",)

    with pytest.raises(PlanFailed) as err:
        plan_or_fail(spec(2), modes)
    assert err.value.reason == "InvalidSpec" and asked == ["out"]
    plan_or_fail(spec(1), modes)  # one node: no API read, plans as before
    assert asked == ["out"]


def _pod(waiting: dict[str, Any], init: bool = False) -> dict[str, Any]:
    key = "initContainerStatuses" if init else "containerStatuses"
    return {
        "metadata": {"name": "job-1", "labels": {"apps.kubernetes.io/pod-index": "1"}},
        "status": {"phase": "Pending", key: [{"name": "trainer", "state": {"waiting": waiting}}]},
    }


@pytest.mark.parametrize(
    ("waiting", "says"),
    [
        ({"reason": "ImagePullBackOff", "message": "Back-off pulling image"}, "trainer ImagePullBackOff: Back-off"),
        ({"reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}, "CreateContainerConfigError"),
        ({"reason": "ContainerCreating"}, None),
    ],
)
def test_waiting_reasons_are_read(waiting: dict[str, Any], says: str | None) -> None:
    view = pod_view(_pod(waiting))
    assert (view.waiting is None) if says is None else (says in str(view.waiting))


def test_waiting_reason_shows_in_the_running_condition() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image trainer:x"}}
    stuck = pod(1, ready=False, state=waiting)
    decision = run(job_with(), [pod(0), stuck])
    running = next(c for c in decision.status.conditions if c.type == "Running")
    assert running.reason == "WaitingForWorkers"
    assert "job-1: trainer ImagePullBackOff: Back-off pulling image trainer:x" in running.message
    assert observe(None, [stuck]).pods[0].waiting
