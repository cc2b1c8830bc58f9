"""The `finetune_operator_jobs` gauge follows every job's headline state, incrementally."""

from __future__ import annotations

from prometheus_client import REGISTRY

from finetune_operator.reconcile.metrics import JobCensus


def gauge(namespace: str, state: str) -> float | None:
    return REGISTRY.get_sample_value("finetune_operator_jobs", {"namespace": namespace, "condition": state})


def test_census_counts_moves_between_states_and_forgets_deleted_jobs() -> None:
    census = JobCensus()
    ns = "census-test"
    census.record("a", ns, "Pending")
    census.record("b", ns, "Pending")
    assert gauge(ns, "Pending") == 2
    assert gauge(ns, "Running") == 0  # every state of a namespace exists once it is seen
    census.record("a", ns, "Running")
    census.record("a", ns, "Running")  # a pass that changes nothing
    assert (gauge(ns, "Pending"), gauge(ns, "Running")) == (1, 1)
    census.record("b", ns, None)
    census.record("a", ns, "Succeeded")
    assert (gauge(ns, "Pending"), gauge(ns, "Running"), gauge(ns, "Succeeded")) == (0, 0, 1)
    census.record("a", "", None)  # deletion knows only the uid
    assert gauge(ns, "Succeeded") == 0


def restarts(namespace: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(
        "finetune_operator_job_gang_restarts", {"namespace": namespace, "finetune_job": name}
    )


def since(namespace: str, name: str, state: str) -> float | None:
    labels = {"namespace": namespace, "finetune_job": name, "state": state}
    return REGISTRY.get_sample_value("finetune_operator_job_state_since_timestamp_seconds", labels)


def test_named_jobs_export_their_restarts_and_the_start_of_their_state() -> None:
    census = JobCensus()
    ns = "census-alerts"
    census.record("a", ns, "Queued", name="job-a", restarts=0, since=1000.0)
    assert (restarts(ns, "job-a"), since(ns, "job-a", "Queued")) == (0, 1000.0)
    census.record("a", ns, "Running", name="job-a", restarts=0, since=1500.0)
    assert since(ns, "job-a", "Queued") is None  # one series per job: the state it is in now
    assert since(ns, "job-a", "Running") == 1500.0
    census.record("a", ns, "Restarting", name="job-a", restarts=1, since=1600.0)
    census.record("a", ns, "Running", name="job-a", restarts=1, since=1700.0)
    assert (restarts(ns, "job-a"), since(ns, "job-a", "Running"), since(ns, "job-a", "Restarting")) == (1, 1700.0, None)
    census.record("a", "", None)  # deleted: its series go with it
    assert (restarts(ns, "job-a"), since(ns, "job-a", "Running")) == (None, None)


def test_the_state_starts_at_its_conditions_transition_or_the_creation_when_pending() -> None:
    from finetune_operator.api.reasons import State
    from finetune_operator.api.status import Condition, FineTuneJobStatus
    from finetune_operator.reconcile.metrics import state_since

    created = "2026-12-01T10:00:00Z"
    queued = Condition(type="Queued", status="True", reason="Waiting", last_transition_time="2026-12-01T10:05:00Z")
    planned = Condition(type="Planned", status="True", reason="Planned", last_transition_time="2026-12-01T10:01:00Z")
    status = FineTuneJobStatus(state=State.QUEUED, conditions=[planned, queued])
    assert state_since(status, created) == 1796119500.0  # 10:05 UTC, Queued's transition, not Planned's
    assert state_since(FineTuneJobStatus(state=State.PENDING), created) == 1796119200.0
    assert state_since(FineTuneJobStatus(state=State.RUNNING, conditions=[planned]), created) is None


def test_a_reconcile_pass_exports_the_jobs_state_start_and_its_gang_restarts() -> None:
    from datetime import UTC, datetime

    from finetune_operator.reconcile.observed import observe
    from finetune_operator.reconcile.runner import Reconciler
    from finetune_operator.render.options import RenderOptions
    from tests.support.cluster import FakeCluster, config_hash_of, statefulset_of, stored_job
    from tests.support.lifecycle import exited, pod

    start = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    store = FakeCluster(stored_job())
    reconciler = Reconciler(store, RenderOptions(trainer_image="t"), lambda *_: None, clock=lambda: start)
    reconciler.reconcile(store.job(), observe(None, []))
    meta, status = store.body["metadata"], store.body["status"]
    ns, name = meta["namespace"], meta["name"]
    assert (restarts(ns, name), since(ns, name, status["state"])) == (0, start.timestamp())
    sts = statefulset_of(store.applied[-1])
    failed = [pod(0, config_hash=config_hash_of(sts), state={"terminated": exited(1, "", "Error")}),
              pod(1, config_hash=config_hash_of(sts))]  # fmt: skip
    reconciler.reconcile(store.job(), observe(sts, failed))
    assert store.body["status"]["restarts"] == restarts(ns, name) == 1
    reconciler.forget(meta["uid"])
    assert restarts(ns, name) is None
