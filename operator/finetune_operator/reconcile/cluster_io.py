"""The few reads and writes the operator makes, and the official Kubernetes client making them.

`ClusterIO` is what the reconciler asks of the cluster, as a Protocol: `KubernetesClusterIO`
is the one that talks to the apiserver; the unit tests' in-memory cluster is another, which
mypy checks against the same Protocol.

Children are server-side applied under one field manager (idempotent: an operator
restart re-applies the same objects and creates no duplicates), and only over objects the
job controls: an object of a child's name that someone else made is never taken over.
Status goes through the status subresource as a JSON merge patch guarded by the
resourceVersion the decision was made on; a gang restart deletes every pod the job's StatefulSet owns, by
name with a uid precondition (never a deletecollection by label: a label is no proof of
ownership, and a foreign pod carrying it must survive).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..api.job import GROUP, KIND, PLURAL, VERSION
from ..render.identity import FIELD_MANAGER
from ..render.serving.objects import SERVED_JOB_UID_ANNOTATION
from .observed import controller_uid

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
TIMEOUT = 15


NOT_OURS = (
    "exists and is not controlled by this job; the operator never takes over an object it did not create: "
    "delete it or rename the job"
)


NOT_SERVED_BY_JOB = (
    "exists and was not applied for this job (no finetune.dev/served-job-uid annotation of its uid); the "
    "operator never takes over a serving object it did not create: delete it or set spec.serving.name"
)


class Conflict(Exception):
    """The job changed since it was read; decide again on the fresh object."""


class JobGone(Conflict):
    """The job was deleted since it was read: there is nothing left to decide on."""


class ChildWriteError(Exception):
    """A child of the job could not be written: someone else's object of its name (`conflict`),
    a refusal by the apiserver (`status`, its message) or no answer (`status` None)."""

    def __init__(self, kind: str, name: str, status: int | None, message: str, *, conflict: bool = False) -> None:
        super().__init__(f"{kind} {name} {message}" if conflict else f"cannot write {kind} {name}: {message}")
        self.kind, self.name, self.status, self.message, self.conflict = kind, name, status, message, conflict


class ClusterIO(Protocol):
    """The cluster as the reconciler sees it: the job, its children, its Kueue Workload."""

    def apply(self, objects: Iterable[dict[str, Any]], owner_uid: str) -> None:
        """Server-side apply the job's children (owned by the job of uid `owner_uid`); a child
        that cannot be written raises `ChildWriteError`."""

    def apply_served(self, objects: Iterable[dict[str, Any]], job_uid: str) -> None:
        """Server-side apply the objects that serve the job's result (not owned by it); one of the
        same name that another job (or someone) made raises `ChildWriteError`."""

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]]) -> None:
        """Delete the given (name, uid) pods; one gone or replaced meanwhile is skipped."""

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job as stored now; None once it is deleted."""

    def patch_status(self, namespace: str, name: str, resource_version: str | None, status: dict[str, Any]) -> str:
        """Write the status decided on `resource_version` and return the new one; `Conflict` if
        the job changed since, `JobGone` if it was deleted."""

    def claim_access_modes(self, namespace: str, claim: str) -> tuple[str, ...] | None:
        """A PersistentVolumeClaim's access modes; None if there is no such claim."""

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap as stored (the job's model record); None if there is none."""

    def pod_warning(self, namespace: str, pod_uid: str) -> str | None:
        """The newest Warning Event about a pod (`Reason: message`), if any."""

    def workload_status(self, namespace: str, name: str, resource_version: str, status: dict[str, Any]) -> None:
        """Write a Kueue Workload's status decided on `resource_version` (a stale one is left to the next pass)."""

    def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        """Delete a Kueue Workload if it is still the one of that uid."""

    def flavor_node_labels(self, flavor: str) -> dict[str, str]:
        """A Kueue ResourceFlavor's nodeLabels ({} if none or gone)."""

    def workload_priority(self, priority_class: str) -> int | None:
        """A Kueue WorkloadPriorityClass's value; None if there is no such class."""

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete the job (its children go with it); one already gone is not an error."""


class KubernetesClusterIO:
    """`ClusterIO` through the official Kubernetes client (one connection pool per instance)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api_client = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def apply(self, objects: Iterable[dict[str, Any]], owner_uid: str) -> None:
        """Apply the job's children; never take over an object the job does not control.

        An existing object of a child's name is applied over (forced, so the operator's
        fields win over hand edits) only when its controller ownerReference is the job
        (`owner_uid`), and the apply names that object's uid, so one replaced meanwhile is
        not written either. Any refusal raises `ChildWriteError`, for a condition on the job.
        """
        self._apply_guarded(
            objects, lambda existing: bool(owner_uid) and controller_uid(existing, KIND) == owner_uid, NOT_OURS
        )

    def apply_served(self, objects: Iterable[dict[str, Any]], job_uid: str) -> None:
        """Apply the serving objects: created when absent, applied over (forced, naming its uid)
        only when the existing one carries this job's uid annotation."""

        def ours(existing: dict[str, Any]) -> bool:
            annotations = (existing.get("metadata") or {}).get("annotations") or {}
            return bool(job_uid) and annotations.get(SERVED_JOB_UID_ANNOTATION) == job_uid

        self._apply_guarded(objects, ours, NOT_SERVED_BY_JOB)

    def _apply_guarded(
        self, objects: Iterable[dict[str, Any]], ours: Callable[[dict[str, Any]], bool], not_ours: str
    ) -> None:
        """Create each object that is absent; apply over (forced, naming its uid, so one replaced
        meanwhile is not written) one that `ours` says the job may write; refuse any other with
        `not_ours`. Every refusal or apiserver error raises `ChildWriteError`."""
        for obj in objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            try:
                existing = self._read_child(obj)
                if existing is None:
                    self._apply_one(obj, force=False)
                    continue
                if not ours(existing):
                    raise ChildWriteError(kind, name, None, not_ours, conflict=True)
                uid = (existing.get("metadata") or {}).get("uid")
                self._apply_one({**obj, "metadata": {**obj["metadata"], "uid": uid}}, force=True)
            except ApiException as exc:
                raise ChildWriteError(kind, name, exc.status, _api_message(exc)) from exc
            except HTTPError as exc:
                raise ChildWriteError(kind, name, None, f"{type(exc).__name__}: {exc}") from exc

    def _read_child(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        name, namespace, kind = obj["metadata"]["name"], obj["metadata"]["namespace"], obj["kind"]
        kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": TIMEOUT}
        response: Any
        try:
            if kind == "ConfigMap":
                response = self.core.read_namespaced_config_map(name, namespace, **kwargs)
            elif kind == "Service":
                response = self.core.read_namespaced_service(name, namespace, **kwargs)
            elif kind == "StatefulSet":
                response = self.apps.read_namespaced_stateful_set(name, namespace, **kwargs)
            elif kind == "Pod":
                response = self.core.read_namespaced_pod(name, namespace, **kwargs)
            else:
                group, version = obj["apiVersion"].split("/")
                plural = kind.lower() + "s"
                response = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = json.loads(getattr(response, "data", b"{}") or b"{}")
        _release(response)
        return body

    def _apply_one(self, obj: dict[str, Any], force: bool) -> None:
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        kwargs: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force": force,
            "_content_type": APPLY,
            "_preload_content": False,
            "_request_timeout": TIMEOUT,
        }
        kind = obj["kind"]
        response: Any
        if kind == "ConfigMap":
            response = self.core.patch_namespaced_config_map(name, namespace, obj, **kwargs)
        elif kind == "Service":
            response = self.core.patch_namespaced_service(name, namespace, obj, **kwargs)
        elif kind == "StatefulSet":
            response = self.apps.patch_namespaced_stateful_set(name, namespace, obj, **kwargs)
        elif kind == "Pod":
            response = self.core.patch_namespaced_pod(name, namespace, obj, **kwargs)
        else:
            group, version = obj["apiVersion"].split("/")
            plural = kind.lower() + "s"
            response = self.custom.patch_namespaced_custom_object(
                group, version, namespace, plural, name, obj, **kwargs
            )
        _release(response)

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]]) -> None:
        """Gang restart: delete the given (name, uid) pods; the StatefulSet recreates them.

        The uid precondition makes a pod recreated under the same name since it was
        observed (a new uid) survive; one already gone (404) or replaced (409) is skipped.
        """
        for name, uid in pods:
            options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
            try:
                self.core.delete_namespaced_pod(name, namespace, body=options, _request_timeout=TIMEOUT)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = json.loads(getattr(response, "data", b"{}"))
        _release(response)
        return body

    def patch_status(self, namespace: str, name: str, resource_version: str | None, status: dict[str, Any]) -> str:
        """Replace the status; stale resourceVersion → Conflict (never overwrite newer counts), a
        job deleted meanwhile → JobGone (a pass that raced the deletion, not an error).

        Returns the job's new resourceVersion.
        """
        patch: dict[str, Any] = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        response: Any
        try:
            response = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, patch,
                _content_type=MERGE, _request_timeout=TIMEOUT, _preload_content=False,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from exc
            if exc.status == 404:
                raise JobGone(f"{namespace}/{name}") from exc
            raise
        body = json.loads(response.data or b"{}")
        _release(response)
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap as JSON (the job's model record), None if it does not exist."""
        return self._read_child({"kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}})

    def claim_access_modes(self, namespace: str, claim: str) -> tuple[str, ...] | None:
        """A claim's access modes: its bound volume's (status), else the requested ones; None if absent."""
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(claim, namespace, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        modes = (pvc.status.access_modes if pvc.status else None) or (pvc.spec.access_modes if pvc.spec else None)
        return tuple(modes or ())

    def pod_warning(self, namespace: str, pod_uid: str) -> str | None:
        """The newest Warning Event about a pod (`FailedAttachVolume: Multi-Attach error ...`), if any:
        what keeps a pod in ContainerCreating is told in Events, not in its status."""
        events = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.uid={pod_uid},type=Warning", _request_timeout=TIMEOUT
        )
        newest = max(
            events.items or [],
            key=lambda e: str(e.last_timestamp or e.event_time or e.first_timestamp or ""),
            default=None,
        )
        if newest is None:
            return None
        return f"{newest.reason or 'Warning'}: {' '.join(str(newest.message or '').split())[:300]}"

    def workload_status(self, namespace: str, name: str, resource_version: str, status: dict[str, Any]) -> None:
        """Write a Kueue Workload's status (as its job controller): a merge patch guarded by the
        resourceVersion it was decided on; a stale one (409) or a Workload gone (404) is left to
        the next pass."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            response = self.custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", name, patch,
                _content_type=MERGE, _request_timeout=TIMEOUT, _preload_content=False,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status in (404, 409):
                return
            raise
        _release(response)

    def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        """Delete a job's Workload by name with a uid precondition (one replaced meanwhile survives)."""
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            self.custom.delete_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", name, body=options, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def flavor_node_labels(self, flavor: str) -> dict[str, str]:
        """A Kueue ResourceFlavor's nodeLabels (where pods admitted on it must run); {} if it has none or is gone."""
        try:
            response = self.custom.get_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", flavor, _preload_content=False, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        body = json.loads(getattr(response, "data", b"{}") or b"{}")
        _release(response)
        labels = (body.get("spec") or {}).get("nodeLabels") or {}
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}

    def workload_priority(self, priority_class: str) -> int | None:
        """A Kueue WorkloadPriorityClass's value; None if there is no such class."""
        try:
            response = self.custom.get_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", priority_class,
                _preload_content=False, _request_timeout=TIMEOUT,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body = json.loads(getattr(response, "data", b"{}") or b"{}")
        _release(response)
        value = body.get("value")
        return value if isinstance(value, int) else None

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background", _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status != 404:
                raise


def _api_message(exc: ApiException) -> str:
    """The apiserver's own message (a Status body), else the HTTP status and reason."""
    try:
        message = json.loads(exc.body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{exc.status} {exc.reason}")[:2000]


def _release(response: Any) -> None:
    """Read a raw (not deserialised) response to its end and give its connection back.

    Without this, urllib3 never returns the connection to the pool: every call would
    open a new TLS connection to the apiserver (measured: most of the operator's CPU
    in a burst of creations went into handshakes).
    """
    if hasattr(response, "release_conn"):
        _ = response.data
        response.release_conn()


def status_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A merge-patch body that turns `old` into `new`: removed keys become null, at any depth (a
    merge patch merges objects key by key, so a key left out of a nested object would stay)."""
    out: dict[str, Any] = dict(new)
    for key, value in (old or {}).items():
        if key not in new:
            out[key] = None
        elif isinstance(value, dict) and isinstance(new[key], dict):
            out[key] = status_patch(value, new[key])
    return out
