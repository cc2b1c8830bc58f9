"""One reconciliation of one FineTuneJob: parse → plan → render → apply → status.

Every pass of the work queue (after a job, pod or StatefulSet event, or when a pass
asked to run again) calls `Reconciler.reconcile`. It decides on the cached body first;
only when the decision has an effect does it re-read the job, decide again on the fresh
object and write, so an idle job costs no API calls and a stale cache never
double-counts a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from ..api import FineTuneJob, describe
from ..api import reasons as R
from ..api.spec import FineTuneJobSpec
from ..api.status import FineTuneJobStatus, PlanStatus
from ..api.timestamps import parse_timestamp, timestamp
from ..plan import choose_plan, next_frugal_plan
from ..plan.errors import PlanningError
from ..plan.scheduling_policy import SchedulingPolicy
from ..plan.storage import check_shared_storage, written_claims
from ..render.manifests import gang_hash, render_all
from ..render.options import RenderOptions
from ..render.workload import priority_class_of, with_priority
from . import metrics
from .cluster_io import ChildWriteError, ClusterIO, Conflict, status_patch
from .lifecycle import Decision, Event, PlanFailed, decide
from .observed import Observed
from .policies.child_write import after_write_error
from .policies.queueing import finished_status, released_status
from .progress import Sample, fetch, parse, to_progress
from .salvage import invalid_spec_status, salvage_status
from .tracking import TrackingReport, parse_report

log = logging.getLogger("finetune_operator")
EventSink = Callable[[Mapping[str, Any], Event], None]
PROGRESS_EVERY_SECONDS = 3.0
WARNING_AFTER_SECONDS = 20.0
"""A pod not running this long gets its newest Warning Event read (FailedAttachVolume, ...)."""
WARNING_EVERY_SECONDS = 15.0
"""How often rank 0's metrics are read (one small HTTP GET per running job)."""


def plan_or_fail(
    spec: FineTuneJobSpec,
    access_modes: Callable[[str], tuple[str, ...] | None] | None = None,
    policy: SchedulingPolicy = SchedulingPolicy(),  # noqa: B008 (frozen, so one shared default is safe)
) -> PlanStatus:
    """The plan, or PlanFailed; `access_modes` reads a claim's access modes (multi-node jobs),
    `policy` is what this installation lets a job ask of the scheduler."""
    try:
        policy.check(spec)
        if access_modes is not None and spec.resources.num_nodes > 1:
            check_shared_storage(spec, {claim: access_modes(claim) for claim in written_claims(spec)})
        return choose_plan(spec, local_files=False)
    except PlanningError as exc:
        raise PlanFailed(exc.condition_reason, str(exc)) from exc


KUEUE_NOT_SERVED = (
    "404: this cluster does not serve Kueue's Workload API (kueue.x-k8s.io/v1beta2): install Kueue, or run "
    "the job without a queue (remove spec.queueName)"
)


@dataclass
class Outcome:
    """What a reconciliation did (for handlers, metrics and tests)."""

    decision: Decision | None
    wrote_status: bool
    applied: bool
    requeue_after: float | None


class Reconciler:
    """Decides on the body it is given and acts; status writes carry the body's resourceVersion,
    so a write decided on a stale body is refused (409) and decided again on the next pass."""

    def __init__(
        self,
        cluster: ClusterIO,
        options: RenderOptions,
        sink: EventSink,
        policy: SchedulingPolicy = SchedulingPolicy(),  # noqa: B008 (frozen)
    ) -> None:
        self.cluster = cluster
        self.options = options
        self.policy = policy
        self.sink = sink
        self.census = metrics.JobCensus()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._samples: dict[str, Sample] = {}
        self._scraped_at: dict[str, float] = {}
        self._hashes: dict[str, tuple[tuple[str, str], str]] = {}
        self._written: dict[str, str] = {}
        self._warnings: dict[str, tuple[float, str | None]] = {}
        self._flavors: dict[str, dict[str, str]] = {}

    def _desired_hash(self, job: FineTuneJob, plan: PlanStatus) -> str:
        """`gang_hash`, remembered per job: it renders every config file, and each pass needs it."""
        uid = job.metadata.uid or ""
        key = (job.spec.model_dump_json(), plan.model_dump_json())
        cached = self._hashes.get(uid)
        if cached is not None and cached[0] == key:
            return cached[1]
        value = gang_hash(job, plan, self.options)
        self._hashes[uid] = (key, value)
        return value

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    def forget(self, uid: str) -> None:
        with self._locks_guard:
            self._locks.pop(uid, None)
        self._samples.pop(uid, None)
        self._scraped_at.pop(uid, None)
        self._hashes.pop(uid, None)
        self._written.pop(uid, None)
        self.census.record(uid, "", None)

    def reconcile(self, body: Mapping[str, Any], observed: Observed, apply_all: bool = False) -> Outcome:
        """Reconcile one job; `apply_all` (create, resume, spec change) re-applies every child."""
        uid = str(body.get("metadata", {}).get("uid", ""))
        started = time.monotonic()
        metrics.ACTIVE_WORKERS.labels(metrics.CONTROLLER).inc()
        try:
            with self._lock(uid):
                outcome = self._reconcile(dict(body), observed, apply_all)
        except Exception:
            metrics.RECONCILE_ERRORS.labels(metrics.CONTROLLER).inc()
            metrics.RECONCILE_TOTAL.labels(metrics.CONTROLLER, "error").inc()
            raise
        finally:
            metrics.ACTIVE_WORKERS.labels(metrics.CONTROLLER).dec()
            metrics.RECONCILE_TIME.labels(metrics.CONTROLLER).observe(time.monotonic() - started)
        result = "requeue_after" if outcome.requeue_after else "success"
        metrics.RECONCILE_TOTAL.labels(metrics.CONTROLLER, result).inc()
        return outcome

    def _reconcile(self, body: dict[str, Any], observed: Observed, apply_all: bool) -> Outcome:
        meta = body.get("metadata", {})
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        decision, job = self._decide(body, observed)
        if job is None:
            return self._write_invalid(body, namespace, name, decision)
        effects = self._has_effects(body, job, observed, decision) or apply_all
        if not effects:
            self.census.record(job.metadata.uid or "", namespace, decision.status.state)
            return Outcome(decision, False, False, decision.requeue_after)
        fresh: Mapping[str, Any] = body
        changes_gang = observed.workers is not None and self._needs_apply(job, observed, decision)
        if decision.delete_pods or decision.delete_job or changes_gang:
            # destructive, or re-rendering running workers: decide again on the newest object,
            # never on a cache that may lag our own last status write (that would restart a gang
            # twice for one failure, or put back the plan a re-plan after an OOM replaced)
            newest = self.cluster.read_job(namespace, name)
            if newest is None:
                return Outcome(None, False, False, None)
            fresh = newest
            decision, job = self._decide(fresh, observed)
            if job is None:
                return self._write_invalid(fresh, namespace, name, decision)
        applied = early_events = False
        if _scales_to_zero(observed, decision) and (fresh.get("status") or {}) != decision.status.to_wire():
            # The verdict first: a finished gang's exit codes live only in its pods, which the
            # scale-down deletes. An operator killed between the two would find neither.
            if not self._write_status(fresh, decision):
                return Outcome(decision, False, False, None)  # lost a race: the next pass decides again
            fresh, early_events = self._as_written(fresh, decision), True
        if decision.plan is not None and (apply_all or self._needs_apply(job, observed, decision)):
            gang = self._desired_hash(job, decision.plan)
            objects = render_all(
                job, decision.plan, self.options, decision.replicas, gang, placement=decision.placement
            )
            try:
                self.cluster.apply(objects, job.metadata.uid or "")
                applied = True
            except ChildWriteError as exc:
                log.warning("job %s/%s: %s", namespace, name, exc)
                decision = after_write_error(job, decision, exc, datetime.now(UTC))
        decision = self._write_workload(job, observed, decision)
        # The status (the counted failure, its fingerprint, the new plan) is written before the
        # failed pods are deleted: an operator killed in between then finds the same failure
        # already counted and only deletes, instead of finding new pods and no trace of it.
        unchanged = (fresh.get("status") or {}) == decision.status.to_wire()
        wrote = self._write_status(fresh, decision) or early_events
        if decision.delete_pods and (wrote or unchanged):
            self.cluster.delete_pods(namespace, [(p.name, p.uid) for p in observed.pods if not p.deleting])
        if wrote:
            for event in decision.events:
                self._count(namespace, event)
                self.sink(fresh, event)
        if decision.delete_job:
            self.cluster.delete_job(namespace, name)
            for event in decision.events:
                self.sink(fresh, event)
        self.census.record(job.metadata.uid or "", namespace, decision.status.state)
        return Outcome(decision, wrote, applied, decision.requeue_after)

    def _write_workload(self, job: FineTuneJob, observed: Observed, decision: Decision) -> Decision:
        """Kueue's side of a queued job: create its Workload, give back an evicted one's quota,
        mark a finished one's Workload Finished."""
        namespace, wl = job.namespace, observed.workload
        now = timestamp(datetime.now(UTC))
        if decision.workload is not None and wl is None:
            try:
                self.cluster.apply([self._prioritised(decision.workload, job)], job.metadata.uid or "")
            except ChildWriteError as exc:
                if exc.status == 404 and exc.kind == "Workload":  # the job's namespace exists: the API does not
                    exc = ChildWriteError(exc.kind, exc.name, 404, KUEUE_NOT_SERVED)
                log.warning("job %s/%s: %s", namespace, job.name, exc)
                return after_write_error(job, decision, exc, datetime.now(UTC))
        if wl is not None and decision.delete_workload:
            self.cluster.delete_workload(namespace, wl.name, wl.uid)
        if wl is not None and decision.release_workload:
            self.cluster.workload_status(namespace, wl.name, wl.resource_version, released_status(wl, now))
        if wl is not None and decision.finish_workload:
            status = finished_status(wl, decision.finish_workload, now)
            self.cluster.workload_status(namespace, wl.name, wl.resource_version, status)
        return decision

    def _prioritised(self, body: dict[str, Any], job: FineTuneJob) -> dict[str, Any]:
        """The Workload with the value of the job's WorkloadPriorityClass (label `kueue.x-k8s.io/priority-class`)."""
        priority_class = priority_class_of(job)
        if priority_class is None:
            return body
        try:
            value = self.cluster.workload_priority(priority_class)
        except ApiException as exc:
            raise ChildWriteError("WorkloadPriorityClass", priority_class, exc.status, str(exc.reason)) from exc
        if value is None:
            raise ChildWriteError("WorkloadPriorityClass", priority_class, 404, "not found: create it or fix the label")
        return with_priority(body, priority_class, value)

    def _with_flavors(self, observed: Observed) -> Observed:
        """The admitted Workload with its flavors' nodeLabels (read from the ResourceFlavors, cached)."""
        wl = observed.workload
        if wl is None or not wl.admitted or not wl.flavors:
            return observed
        labels: dict[str, str] = {}
        for flavor in wl.flavors:
            if flavor not in self._flavors:
                self._flavors[flavor] = self.cluster.flavor_node_labels(flavor)
            labels.update(self._flavors[flavor])
        return replace(observed, workload=replace(wl, node_labels=tuple(sorted(labels.items()))))

    def _decide(self, body: Mapping[str, Any], observed: Observed) -> tuple[Decision, FineTuneJob | None]:
        now = datetime.now(UTC)
        raw_status = body.get("status")
        status = salvage_status(raw_status)
        try:
            job = FineTuneJob.from_manifest({**body, "status": None})
        except ValidationError as exc:
            lines = describe(exc, FineTuneJob)
            return Decision(invalid_spec_status(status, lines, body, now), replicas=0, plan=None), None
        job = job.model_copy(update={"status": status})
        namespace = job.metadata.namespace or ""
        progress, tracking = self._progress(job, observed, now)
        observed = self._with_flavors(self._with_warnings(namespace, observed, now))
        decision = decide(
            job,
            observed,
            now,
            planner=lambda spec: plan_or_fail(
                spec, lambda claim: self.cluster.claim_access_modes(namespace, claim), self.policy
            ),
            replanner=next_frugal_plan,
            desired_config_hash=lambda plan: self._desired_hash(job, plan),
            progress=progress,
            default_queue=self.options.default_queue_name,
            tracking_report=tracking,
        )
        return decision, job

    def _progress(self, job: FineTuneJob, observed: Observed, now: datetime) -> tuple[Any, TrackingReport | None]:
        """Rank 0's progress (the last one between scrapes) and, from a fresh scrape, its tracking report."""
        rank0 = next((p for p in observed.live_pods if p.ordinal == 0 and p.ip and p.phase == "Running"), None)
        uid = job.metadata.uid or ""
        if rank0 is None:
            return None, None
        last = self._scraped_at.get(uid)
        if last is not None and time.time() - last < PROGRESS_EVERY_SECONDS:
            return (job.status.progress if job.status else None), None
        # a failed read waits its turn too: an unreachable rank 0 costs one timeout per period, not per pass
        self._scraped_at[uid] = time.time()
        text = fetch(f"http://{rank0.ip}:{self.options.metrics_port}/metrics")
        values = parse(text) if text is not None else None
        if text is None or values is None:
            return (job.status.progress if job.status else None), None
        sample = Sample(at=time.time(), values=values)
        progress = to_progress(now, sample, self._samples.get(uid))
        self._samples[uid] = sample
        return progress, parse_report(text)

    def _with_warnings(self, namespace: str, observed: Observed, now: datetime) -> Observed:
        """Pods stuck before their containers run, with the newest Warning Event about them.

        Only pods not ready for WARNING_AFTER_SECONDS and with nothing better to say (not
        unschedulable, no waiting reason); read at most every WARNING_EVERY_SECONDS per pod."""
        pods = []
        for view in observed.pods:
            created = parse_timestamp(view.created)
            quiet = view.phase == "Pending" and not (view.deleting or view.unschedulable or view.waiting)
            if quiet and created is not None and (now - created).total_seconds() >= WARNING_AFTER_SECONDS:
                pods.append(replace(view, warning=self._warning(namespace, view.uid)))
            else:
                pods.append(view)
        horizon = time.monotonic() - 600  # entries of pods gone for ten minutes
        for uid in [u for u, (at, _) in self._warnings.items() if at < horizon]:
            del self._warnings[uid]
        return replace(observed, pods=tuple(pods))

    def _warning(self, namespace: str, uid: str) -> str | None:
        at, last = self._warnings.get(uid, (0.0, None))
        if time.monotonic() - at < WARNING_EVERY_SECONDS:
            return last
        try:
            last = self.cluster.pod_warning(namespace, uid)
        except Exception:  # an explanation is optional: never fail a pass for it
            last = None
        self._warnings[uid] = (time.monotonic(), last)
        return last

    def _has_effects(self, body: Mapping[str, Any], job: FineTuneJob, observed: Observed, d: Decision) -> bool:
        old = salvage_status(body.get("status"))
        changed = _without_progress_time(d.status) != _without_progress_time(old)
        kueue = (d.workload is not None and observed.workload is None) or d.release_workload or d.delete_workload
        kueue = kueue or bool(d.finish_workload)
        return changed or kueue or d.delete_pods or d.delete_job or self._needs_apply(job, observed, d)

    def _needs_apply(self, job: FineTuneJob, observed: Observed, d: Decision) -> bool:
        if d.plan is None:
            return False
        workers = observed.workers
        desired = self._desired_hash(job, d.plan)
        return workers is None or workers.replicas != d.replicas or workers.config_hash != desired

    def _write_status(self, body: Mapping[str, Any], decision: Decision) -> bool:
        old = body.get("status") or {}
        new = decision.status.to_wire()
        if old == new:
            return False
        meta = body.get("metadata", {})
        try:
            written = self.cluster.patch_status(
                meta["namespace"], meta["name"], meta.get("resourceVersion"), status_patch(old, new)
            )
        except Conflict:  # JobGone too: no pass follows a deletion
            return False  # the next pass decides again on the newer object
        self._written[str(meta.get("uid", ""))] = written
        return True

    def _as_written(self, body: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
        """The job as this operator's last status write left it (its status, its new version)."""
        meta = dict(body.get("metadata", {}))
        meta["resourceVersion"] = self._written.get(str(meta.get("uid", "")), meta.get("resourceVersion"))
        return {**body, "metadata": meta, "status": decision.status.to_wire()}

    def is_own_write(self, uid: str, resource_version: str) -> bool:
        """Whether this version of the job is the status this operator just wrote: its watch
        event needs no pass (the pass that wrote it already decided on everything else)."""
        return bool(resource_version) and self._written.get(uid) == resource_version

    def _write_invalid(self, body: Mapping[str, Any], namespace: str, name: str, decision: Decision) -> Outcome:
        wrote = self._write_status(body, decision)
        if wrote:
            failed = [c for c in decision.status.conditions if c.type == "Failed"]
            self.sink(body, Event("Warning", R.INVALID_SPEC, failed[0].message if failed else "invalid spec"))
        self.census.record(str(body.get("metadata", {}).get("uid", "")), namespace, decision.status.state)
        return Outcome(decision, wrote, False, None)

    @staticmethod
    def _count(namespace: str, event: Event) -> None:
        if event.reason in (R.RANK_FAILED, R.REPLANNED):
            metrics.RESTARTS.labels(namespace).inc()
        if event.reason == R.REPLANNED:
            metrics.REPLANS.labels(R.OUT_OF_MEMORY).inc()


def _scales_to_zero(observed: Observed, decision: Decision) -> bool:
    """Whether this pass scales running workers down to none (success, failure, suspension)."""
    return decision.plan is not None and decision.replicas == 0 and bool(observed.workers and observed.workers.replicas)


def _without_progress_time(status: FineTuneJobStatus | None) -> Any:
    if status is None or status.progress is None:
        return status
    return status.model_copy(update={"progress": status.progress.model_copy(update={"last_update_time": None})})
