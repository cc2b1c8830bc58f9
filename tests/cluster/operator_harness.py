"""Fixtures that run the real operator (`ftjob operator`) against the local cluster.

The operator is a separate process, exactly as in a pod: it reads the kubeconfig, watches
all namespaces and reconciles every second. Tests drive it only through the API, and
simulate a kubelet's reports on kwok pods by patching pod status (exit codes, OOMKilled,
termination messages), which is all the operator ever reads of a container.
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from finetune_localcluster import Kube, KubeError, wait_for
from tests.factories import job_document

JOBS = "/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs"
REPO = Path(__file__).resolve().parents[2]
POD_DELETE_WAIT_S = 60


@contextlib.contextmanager
def namespaces(kube: Kube, prefix: str) -> Iterator[Callable[..., str]]:
    """`make(restricted=..., labels=...)` creates a fresh namespace `prefix-<random>`; all of them
    are deleted on exit. Each is marked Terminating first (so controllers cannot recreate pods),
    then its pods are deleted and waited for: they hold GPUs on kwok nodes and processes on the
    process node. Removing the rest is left to the namespace controller (~5 s each)."""
    created: list[str] = []

    def make(restricted: bool = False, labels: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        all_labels = dict(labels or {})
        if restricted:
            all_labels["pod-security.kubernetes.io/enforce"] = "restricted"
        kube.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": all_labels}})
        created.append(name)
        return name

    try:
        yield make
    finally:
        for name in created:
            with contextlib.suppress(KubeError):
                kube.delete(f"/api/v1/namespaces/{name}")
                kube.delete(f"/api/v1/namespaces/{name}/pods")
        for name in created:

            def pods_gone(n: str = name) -> bool:
                return not kube.items(f"/api/v1/namespaces/{n}/pods")

            wait_for(pods_gone, POD_DELETE_WAIT_S, f"pods of namespace {name} to be deleted")


class Jobs:
    """Small helpers over the FineTuneJob API of one namespace."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.ns = kube, namespace

    def create(self, name: str = "job", **spec: Any) -> dict[str, Any]:
        doc = job_document(**spec)
        doc["metadata"] = {"name": name, "namespace": self.ns}
        return self.kube.create(JOBS.format(ns=self.ns), doc)

    def get(self, name: str = "job") -> dict[str, Any]:
        return self.kube.get(JOBS.format(ns=self.ns) + f"/{name}")

    def patch(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.kube.merge_patch(JOBS.format(ns=self.ns) + f"/{name}", {"spec": spec})

    def status(self, name: str = "job") -> dict[str, Any]:
        status: dict[str, Any] = self.get(name).get("status") or {}
        return status

    def wait(self, check: Callable[[dict[str, Any]], bool], what: str, name: str = "job", timeout: float = 60) -> Any:
        def ready() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status and check(status) else None

        return wait_for(ready, timeout, what)

    def wait_state(self, state: str, name: str = "job", timeout: float = 60) -> dict[str, Any]:
        result: dict[str, Any] = self.wait(lambda s: s.get("state") == state, f"{name} to be {state}", name, timeout)
        return result

    def pods(self, name: str = "job") -> list[dict[str, Any]]:
        items = self.kube.items(f"/api/v1/namespaces/{self.ns}/pods", labelSelector=f"finetune.dev/job-name={name}")
        return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")),
                      key=lambda p: p["metadata"]["name"])  # fmt: skip

    def describe(self, name: str = "job") -> str:
        """The job's status and its pods' statuses, for a failure message."""
        pods = {p["metadata"]["name"]: p.get("status") for p in self.pods(name)}
        return f"status: {json.dumps(self.status(name), indent=1)}\npods: {json.dumps(pods, indent=1)}"

    def statefulset(self, name: str = "job") -> dict[str, Any] | None:
        return self.kube.get_or_none(f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{name}")

    def wait_events(self, reasons: set[str], name: str = "job", timeout: float = 30) -> set[str]:
        """Event reasons seen for the job once all of `reasons` are there (events post asynchronously)."""

        def seen() -> set[str] | None:
            found = {e["reason"] for e in self.events(name)}
            return found if reasons <= found else None

        result: set[str] = wait_for(seen, timeout, f"events {sorted(reasons)} for {name}")
        return result

    def events(self, name: str = "job") -> list[dict[str, Any]]:
        return self.kube.items(f"/api/v1/namespaces/{self.ns}/events", fieldSelector=f"involvedObject.name={name}")

    def report(self, pod: str, terminated: dict[str, Any], last: bool = True, restarts: int = 1) -> None:
        """Play kubelet: the trainer container of `pod` terminated (by default, and as a kubelet
        with restartPolicy Always shows it a moment later: running again, the exit in lastState;
        a pod left not-ready would be reset by kwok's own pod stage, racing the operator)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        term = {"startedAt": now, "finishedAt": now, "reason": "Error", **copy.deepcopy(terminated)}
        state = {"running": {"startedAt": now}} if last else {"terminated": term}
        status = {
            "name": "trainer", "image": "trainer:test", "imageID": "", "ready": last, "started": last,
            "restartCount": restarts, "state": state, "lastState": {"terminated": term} if last else {},
        }  # fmt: skip
        self.kube.merge_patch(f"/api/v1/namespaces/{self.ns}/pods/{pod}/status",
                              {"status": {"containerStatuses": [status]}})  # fmt: skip


def gpu_job(**spec: Any) -> dict[str, Any]:
    """A 2 × 8 GPU LoRA job on the kwok nodes."""
    resources = {"numNodes": 2, "gpusPerNode": 8, "gpuMemory": "80Gi", **spec.pop("resources", {})}
    return {"resources": resources, **spec}


def small(**spec: Any) -> dict[str, Any]:
    """2 pods × 4 GPUs, so two jobs fit the two kwok nodes at once; no claims to bind."""
    spec.setdefault("dataset", {"uri": "/data/train.jsonl"})
    spec.setdefault("output", {"uri": "/output/job"})
    return gpu_job(resources={"gpusPerNode": 4, **spec.pop("resources", {})}, **spec)


def python() -> str:
    return sys.executable
