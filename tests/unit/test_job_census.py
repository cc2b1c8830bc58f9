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
