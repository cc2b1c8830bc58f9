"""What the operator reads back from the cluster, reduced to what decisions need.

Raw Pod and StatefulSet bodies (from kopf indexes or the API) become small frozen
views; everything downstream is a pure function of these views, which keeps the
lifecycle logic testable without a cluster and robust to odd objects: a field that
is missing or malformed reads as "unknown", never as an exception.

Labels select what the watches see, but anyone who may create a pod can set a label:
`owned` keeps only the StatefulSet the job controls and the pods that StatefulSet
controls (ownerReferences, matched by uid), so a foreign pod never decides a job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.job import KIND
from ..render.identity import CONFIG_HASH_ANNOTATION, POD_INDEX_LABEL
from ..render.model_inspector import REQUEST_ANNOTATION as MODEL_REQUEST_ANNOTATION
from ..render.model_inspector import inspector_pod_name
from ..render.placement import GPU_LABELS
from ..render.workload import SPEC_HASH_ANNOTATION as WORKLOAD_HASH_ANNOTATION


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    message: str
    finished_at: str


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    ordinal: int
    phase: str
    ready: bool
    ip: str | None
    restart_count: int
    deleting: bool
    config_hash: str | None
    created: str
    unschedulable: str | None
    terminated: Termination | None
    last_terminated: Termination | None
    waiting: str | None = None
    """Why a container of the pod is not running yet (ImagePullBackOff, CreateContainerConfigError, ...)."""
    warning: str | None = None
    """The newest Warning Event about the pod while it waits (FailedAttachVolume, FailedMount, ...),
    filled in by the reconciler: Events are not part of the pod."""
    owner_uid: str | None = None
    """The uid of the StatefulSet that controls this pod (its controller ownerReference), if any."""
    job_uid: str | None = None
    """The uid of the FineTuneJob that controls this pod directly (the model inspector), if any."""
    model_request: str | None = None
    """What a model inspector pod reads (its request annotation), to tell a stale one."""
    gpu_label: str | None = None
    """The GPU node label the pod's required node affinity names (`render.placement`), if any."""

    @property
    def failure(self) -> Termination | None:
        """The latest non-zero exit of this pod's trainer, if any."""
        for term in (self.terminated, self.last_terminated):
            if term is not None and term.exit_code != 0:
                return term
        return None

    @property
    def completed(self) -> Termination | None:
        """The zero exit that marks this rank as finished, if any."""
        for term in (self.terminated, self.last_terminated):
            if term is not None and term.exit_code == 0:
                return term
        return None

    def fingerprint(self, term: Termination) -> str:
        return f"{self.uid}/{self.restart_count}/{term.finished_at}/{term.exit_code}"


@dataclass(frozen=True)
class WorkersView:
    replicas: int
    config_hash: str | None
    uid: str = ""
    name: str = ""
    owner_uid: str | None = None
    """The uid of the FineTuneJob that controls this StatefulSet (its controller ownerReference), if any."""


@dataclass(frozen=True)
class KueueCondition:
    type: str
    status: str
    reason: str
    message: str
    time: str


@dataclass(frozen=True)
class WorkloadView:
    """The job's Kueue Workload: whether it holds quota, and where Kueue put it."""

    name: str
    uid: str
    resource_version: str
    owner_uid: str | None
    conditions: tuple[KueueCondition, ...]
    flavors: tuple[str, ...]
    """ResourceFlavors of the admission (every resource of every pod set), sorted, deduplicated."""
    spec_hash: str | None = None
    """The operator's hash of what the Workload asks for (its annotation)."""
    node_labels: tuple[tuple[str, str], ...] = ()
    """The admitted flavors' nodeLabels, filled in by the reconciler (they live on the ResourceFlavors)."""

    def condition(self, kind: str) -> KueueCondition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def is_true(self, kind: str) -> bool:
        cond = self.condition(kind)
        return cond is not None and cond.status == "True"

    @property
    def admitted(self) -> bool:
        return self.is_true("Admitted") and not self.is_true("Evicted")

    @property
    def reserved(self) -> bool:
        return self.is_true("QuotaReserved")


@dataclass(frozen=True)
class Observed:
    workers: WorkersView | None
    pods: tuple[PodView, ...] = ()
    workload: WorkloadView | None = None
    inspector: PodView | None = None
    """The job's model inspector pod (`render/model_inspector.py`), while it exists."""

    @property
    def live_pods(self) -> tuple[PodView, ...]:
        return tuple(sorted((p for p in self.pods if not p.deleting), key=lambda p: p.ordinal))


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def controller_uid(body: Mapping[str, Any], kind: str) -> str | None:
    """The uid in the object's controller ownerReference of `kind`, if it has one."""
    refs = _get(body, "metadata", "ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("kind") == kind:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) and uid else None
    return None


def _termination(raw: Any) -> Termination | None:
    if not isinstance(raw, Mapping):
        return None
    code = raw.get("exitCode")
    if not isinstance(code, int):
        return None
    return Termination(
        exit_code=code,
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or ""),
        finished_at=str(raw.get("finishedAt") or ""),
    )


def _ordinal(body: Mapping[str, Any]) -> int:
    label = _get(body, "metadata", "labels", POD_INDEX_LABEL)
    if isinstance(label, str) and label.isdigit():
        return int(label)
    name = str(_get(body, "metadata", "name") or "")
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


BENIGN_WAITING = ("ContainerCreating", "PodInitializing")
"""Waiting reasons every pod passes through: said only when they carry a message."""


def _waiting(body: Mapping[str, Any]) -> str | None:
    """The first container (init containers first) waiting for a reason worth telling the user."""
    statuses = [
        *(_get(body, "status", "initContainerStatuses") or []),
        *(_get(body, "status", "containerStatuses") or []),
    ]
    for status in statuses:
        waiting = _get(status, "state", "waiting")
        if not isinstance(waiting, Mapping):
            continue
        reason, message = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
        if reason in BENIGN_WAITING and not message:
            continue
        name = str(status.get("name") or "container") if isinstance(status, Mapping) else "container"
        return f"{name} {reason or 'Waiting'}" + (f": {message}" if message else "")
    return None


def pod_view(body: Mapping[str, Any]) -> PodView:
    statuses = _get(body, "status", "containerStatuses") or []
    trainer: Mapping[str, Any] = next(
        (s for s in statuses if isinstance(s, Mapping) and s.get("name") == "trainer"),
        statuses[0] if statuses and isinstance(statuses[0], Mapping) else {},
    )
    conditions = _get(body, "status", "conditions") or []
    ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    restarts = trainer.get("restartCount")
    return PodView(
        name=str(_get(body, "metadata", "name") or ""),
        uid=str(_get(body, "metadata", "uid") or ""),
        ordinal=_ordinal(body),
        phase=str(_get(body, "status", "phase") or "Unknown"),
        ready=ready,
        ip=_get(body, "status", "podIP"),
        restart_count=restarts if isinstance(restarts, int) else 0,
        deleting=_get(body, "metadata", "deletionTimestamp") is not None,
        config_hash=_get(body, "metadata", "annotations", CONFIG_HASH_ANNOTATION),
        created=str(_get(body, "metadata", "creationTimestamp") or ""),
        unschedulable=next(
            (
                str(c.get("message") or c.get("reason") or "unschedulable")
                for c in conditions
                if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        ),
        terminated=_termination(_get(trainer, "state", "terminated")),
        last_terminated=_termination(_get(trainer, "lastState", "terminated")),
        waiting=_waiting(body),
        owner_uid=controller_uid(body, "StatefulSet"),
        job_uid=controller_uid(body, KIND),
        model_request=_get(body, "metadata", "annotations", MODEL_REQUEST_ANNOTATION),
        gpu_label=_gpu_label(body),
    )


def _gpu_label(body: Mapping[str, Any]) -> str | None:
    """The first GPU label (GPU Feature Discovery's) a required node selector term of the pod names."""
    required = _get(body, "spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    for term in terms if isinstance(terms, list) else []:
        expressions = term.get("matchExpressions") if isinstance(term, Mapping) else None
        for expression in expressions if isinstance(expressions, list) else []:
            key = expression.get("key") if isinstance(expression, Mapping) else None
            if key in GPU_LABELS.values():
                return str(key)
    return None


def workers_view(body: Mapping[str, Any] | None) -> WorkersView | None:
    if body is None:
        return None
    replicas = _get(body, "spec", "replicas")
    return WorkersView(
        replicas=replicas if isinstance(replicas, int) else 0,
        config_hash=_get(body, "spec", "template", "metadata", "annotations", CONFIG_HASH_ANNOTATION),
        uid=str(_get(body, "metadata", "uid") or ""),
        name=str(_get(body, "metadata", "name") or ""),
        owner_uid=controller_uid(body, KIND),
    )


def workload_view(body: Mapping[str, Any]) -> WorkloadView:
    raw = _get(body, "status", "conditions")
    conditions = tuple(
        KueueCondition(
            type=str(c.get("type") or ""),
            status=str(c.get("status") or "Unknown"),
            reason=str(c.get("reason") or ""),
            message=str(c.get("message") or ""),
            time=str(c.get("lastTransitionTime") or ""),
        )
        for c in (raw if isinstance(raw, list) else [])
        if isinstance(c, Mapping)
    )
    assignments = _get(body, "status", "admission", "podSetAssignments")
    flavors: set[str] = set()
    for assignment in assignments if isinstance(assignments, list) else []:
        named = _get(assignment, "flavors")
        if isinstance(named, Mapping):
            flavors.update(str(f) for f in named.values() if f)
    return WorkloadView(
        name=str(_get(body, "metadata", "name") or ""),
        uid=str(_get(body, "metadata", "uid") or ""),
        resource_version=str(_get(body, "metadata", "resourceVersion") or ""),
        owner_uid=controller_uid(body, KIND),
        conditions=conditions,
        flavors=tuple(sorted(flavors)),
        spec_hash=_get(body, "metadata", "annotations", WORKLOAD_HASH_ANNOTATION),
    )


def observe(statefulset: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> Observed:
    return Observed(workers=workers_view(statefulset), pods=tuple(pod_view(p) for p in pods))


def owned(
    job_name: str,
    job_uid: str,
    workers: Iterable[WorkersView],
    pods: Iterable[PodView],
    workloads: Iterable[WorkloadView] = (),
) -> Observed:
    """What the job controls among the labelled children the watches saw: its StatefulSet
    (named after the job and controlled by `job_uid`) and that StatefulSet's pods (controlled by its uid). A labelled
    object that is not owned is ignored for success, failure and restarts, and never deleted."""
    pods = tuple(pods)
    statefulset = next((w for w in workers if job_uid and w.owner_uid == job_uid and w.name == job_name), None)
    workload = next((w for w in workloads if job_uid and w.owner_uid == job_uid and w.name == job_name), None)
    name = inspector_pod_name(job_name)
    inspector = next((p for p in pods if job_uid and p.job_uid == job_uid and p.name == name), None)
    if statefulset is None or not statefulset.uid:
        return Observed(workers=statefulset, pods=(), workload=workload, inspector=inspector)
    return Observed(
        workers=statefulset,
        pods=tuple(p for p in pods if p.owner_uid == statefulset.uid),
        workload=workload,
        inspector=inspector,
    )
