"""The operator outlives a control-plane restart, and a job's HF token never leaves its Secret."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess
from tests.cluster.operator_harness import Jobs

SPEC: dict[str, Any] = {"model": {"uri": "builtin://tiny-llama"}, "dataset": {"uri": "/data/train.jsonl"},
        "output": {"uri": "/output/job"}, "training": {"maxSteps": 10},
        "resources": {"numNodes": 2, "gpusPerNode": 1, "gpuMemory": "80Gi"}}  # fmt: skip


@pytest.fixture
def ns(robust_kube: Kube) -> Iterator[str]:
    name = f"cp-{secrets.token_hex(4)}"
    robust_kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    robust_kube.delete(f"/api/v1/namespaces/{name}")


def _restarted_pods(jobs: Jobs, name: str, before: set[str]) -> bool:
    return jobs.status(name).get("restarts", 0) >= 1 and not ({p["metadata"]["uid"] for p in jobs.pods(name)} & before)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_operator_recovers_by_itself_after_etcd_and_the_apiserver_restart(
    robust_cluster: LocalCluster, robust_kube: Kube, robust_operator: OperatorProcess, ns: str
) -> None:
    """etcd restarts, then a rank fails and the apiserver stays down for 120 s: longer than one
    cycle of kopf's retries (~54 s; kopf then escalates and starts the watch again). The failure
    is counted once, and a job created afterwards is seen, planned and started."""
    jobs = Jobs(robust_kube, ns)
    jobs.create("before", **SPEC)
    jobs.wait_state("Running", "before")
    robust_cluster.restart("etcd", down_s=5)
    pods = jobs.pods("before")
    jobs.report(pods[0]["metadata"]["name"], {"exitCode": 1, "message": "rank died"})
    robust_cluster.restart("kube-apiserver", down_s=120)
    before = {p["metadata"]["uid"] for p in pods}
    wait_for(lambda: _restarted_pods(jobs, "before", before), 180, "the gang restart after the outage")
    jobs.create("after", **SPEC)  # the watch is back: a new job is planned and started
    jobs.wait_state("Running", "after", timeout=180)
    assert robust_operator.proc is not None and robust_operator.proc.poll() is None, robust_operator.log_tail()
    assert jobs.status("before")["restarts"] == 1


@pytest.mark.slow
def test_the_hf_token_is_never_copied_out_of_its_secret(
    robust_kube: Kube, robust_operator: OperatorProcess, ns: str
) -> None:
    token = "hf_CanaryTokenThatMustNeverBeCopied0123456789"
    robust_kube.create(f"/api/v1/namespaces/{ns}/secrets",
                       {"metadata": {"name": "hf"}, "stringData": {"token": token}})  # fmt: skip
    jobs = Jobs(robust_kube, ns)
    jobs.create(**{**SPEC, "model": {"uri": "meta-llama/Llama-3.1-8B"},
                   "hfTokenSecretRef": {"name": "hf", "key": "token"}})  # fmt: skip
    jobs.wait_state("Running")
    pods = jobs.pods()
    jobs.report(pods[0]["metadata"]["name"], {"exitCode": 1, "message": "401 Unauthorized for the hub"})
    jobs.wait(lambda s: s.get("restarts", 0) >= 1, "a restart")
    places = {
        "configmaps": f"/api/v1/namespaces/{ns}/configmaps",
        "statefulsets": f"/apis/apps/v1/namespaces/{ns}/statefulsets",
        "pods": f"/api/v1/namespaces/{ns}/pods",
        "services": f"/api/v1/namespaces/{ns}/services",
        "events": f"/api/v1/namespaces/{ns}/events",
        "finetunejobs": f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs",
    }
    seen = {kind: json.dumps(robust_kube.items(path)) for kind, path in places.items()}
    assert all(seen.values())
    leaked = [kind for kind, text in seen.items() if token in text]
    assert not leaked, f"the token was copied into {leaked}"
    assert token not in robust_operator.log_path.read_text(errors="replace")
    env = seen["statefulsets"]
    assert '"secretKeyRef": {"name": "hf", "key": "token"}' in env, "the pods read the token from the Secret"
