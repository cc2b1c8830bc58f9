"""The reconciler serves a succeeded job's result (`spec.serving`): it applies the serving
objects once per serving spec and result, names them in `status.serving`, and reports what it
cannot serve or apply as the `Serving` condition, retried, never as the job's failure.

The in-memory cluster of `tests.support.cluster` stands in for the apiserver; decide, render and
the status are the real code (the real apiserver and KServe's CRDs: tests/cluster/test_serving_e2e.py)."""

from __future__ import annotations

from typing import Any

from finetune_operator.reconcile.cluster_io import ChildWriteError
from finetune_operator.reconcile.observed import observe
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.support.cluster import FakeCluster, config_hash_of, statefulset_of, stored_job
from tests.support.lifecycle import exited, pod

BASE = "meta-llama/Llama-3.1-8B"
SUMMARY = '{"finalLoss": 0.5, "steps": 10, "tokens": 100, "adapterUri": "pvc://out/job/adapter"}'


def succeeded(**spec: Any) -> tuple[FakeCluster, Reconciler, list[Any]]:
    """A job run to success (its ranks exited 0), and the events the reconciler emitted."""
    events: list[Any] = []
    store = FakeCluster(stored_job(**spec))
    reconciler = Reconciler(store, RenderOptions(trainer_image="t"), lambda _body, event: events.append(event))
    reconciler.reconcile(store.job(), observe(None, []))
    sts = statefulset_of(store.applied[-1])
    done = [
        pod(i, config_hash=config_hash_of(sts), state={"terminated": exited(0, SUMMARY, "Completed")}) for i in (0, 1)
    ]
    reconciler.reconcile(store.job(), observe(sts, done))
    assert store.body["status"]["state"] == "Succeeded"
    return store, reconciler, events


def serving_condition(store: FakeCluster) -> dict[str, Any]:
    return next(c for c in store.body["status"]["conditions"] if c["type"] == "Serving")


def test_after_success_the_result_is_served_once() -> None:
    store, reconciler, events = succeeded(
        model={"uri": "meta-llama/Llama-3.1-8B"}, serving={"target": "InferenceService"}
    )
    assert store.served == [], "nothing is served before the job succeeded"
    reconciler.reconcile(store.job(), observe(None, []))
    assert len(store.served) == 1
    (isvc,), uid = store.served[0]
    assert (isvc["kind"], uid) == ("InferenceService", "u1")
    assert isvc["spec"]["predictor"]["storageUris"][1]["uri"] == "pvc://out/job/adapter"  # from status.result
    serving = store.body["status"]["serving"]
    assert serving["objects"] == [{"kind": "InferenceService", "name": "job"}]
    assert (serving["served"], serving["modelName"]) == ("adapter", "job")
    assert serving_condition(store)["status"] == "True"
    assert [e.reason for e in events if e.reason.startswith("Serving")] == ["ServingApplied"]
    reconciler.reconcile(store.job(), observe(None, []))
    assert len(store.served) == 1, "applied once: the next pass has nothing to do"
    assert store.body["status"]["state"] == "Succeeded"


def test_a_changed_serving_spec_is_applied_again() -> None:
    store, reconciler, _ = succeeded(model={"uri": BASE}, serving={"target": "Deployment"})
    reconciler.reconcile(store.job(), observe(None, []))
    store.body["spec"]["serving"]["maxLoraRank"] = 64
    store.body["metadata"]["generation"] = 2
    reconciler.reconcile(store.job(), observe(None, []), apply_all=True)
    assert len(store.served) == 2
    deployment = store.served[1][0][0]
    assert "--max-lora-rank=64" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_an_apply_that_fails_is_a_condition_and_is_retried_never_a_failed_job() -> None:
    store, reconciler, events = succeeded(
        model={"uri": "meta-llama/Llama-3.1-8B"}, serving={"target": "InferenceService"}
    )
    store.serving_error = ChildWriteError("InferenceService", "job", 404, "the server could not find the resource")
    outcome = reconciler.reconcile(store.job(), observe(None, []))
    condition = serving_condition(store)
    assert (condition["status"], condition["reason"]) == ("False", "ServingNotApplied")
    assert "could not find the resource" in condition["message"]
    assert store.body["status"]["state"] == "Succeeded" and "serving" not in store.body["status"]
    assert outcome.requeue_after is not None and outcome.requeue_after <= 30
    assert [e.reason for e in events if e.reason.startswith("Serving")] == ["ServingNotApplied"]
    store.serving_error = None  # KServe installed meanwhile: the retry applies it
    reconciler.reconcile(store.job(), observe(None, []))
    assert len(store.served) == 1 and serving_condition(store)["status"] == "True"


def test_what_the_target_cannot_serve_is_a_condition_naming_the_field() -> None:
    store, reconciler, events = succeeded(model={"uri": "builtin://tiny-llama"}, serving={"target": "Deployment"})
    reconciler.reconcile(store.job(), observe(None, []))
    condition = serving_condition(store)
    assert (condition["status"], condition["reason"]) == ("False", "ServingRefused")
    assert condition["message"].startswith("spec.serving.baseModelUri:")
    assert store.served == [] and store.body["status"]["state"] == "Succeeded"
    reconciler.reconcile(store.job(), observe(None, []))
    refusals = [e for e in events if e.reason == "ServingRefused"]
    assert [(e.type, e.message) for e in refusals] == [("Warning", condition["message"])], (
        "one Warning, not one per pass"
    )
