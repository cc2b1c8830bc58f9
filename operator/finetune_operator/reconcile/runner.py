"""One reconciliation of one FineTuneJob: parse → plan → render → apply → status.

Every pass of the work queue (after a job, pod or StatefulSet event, or when a pass
asked to run again) calls `Reconciler.reconcile`. It reads the clock once and decides on the
cached body first; only when the decision has an effect does it act, and before acting on a
running gang it re-reads the job and decides again on the fresh object, so an idle job costs
no API calls and a stale cache never double-counts a restart. `_reconcile` lists the phases
of acting in order; the status goes out through one function, serialised once per decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..api import FineTuneJob, describe
from ..api import reasons as R
from ..api.reasons import ConditionType
from ..api.spec import FineTuneJobSpec
from ..api.status import FineTuneJobStatus, PlanStatus
from ..api.timestamps import parse_timestamp
from ..plan import choose_plan, next_frugal_plan
from ..plan.admission.scheduling_policy import SchedulingPolicy
from ..plan.admission.storage import check_shared_storage, written_claims
from ..plan.errors import PlanningError
from ..plan.sources.model_source import ModelSource
from ..render.manifests import gang_hash, render_gang
from ..render.options import RenderOptions
from . import metrics
from .cluster_io import ChildWriteError, ClusterIO, Conflict, status_patch
from .decision import Decided, Decision, Event, PlanFailed, StatusChange, serialised
from .kueue_writes import KueueWrites
from .lifecycle import decide
from .model_sources import HubSettings, ModelSources
from .observed import Observed
from .policies import child_write, serving
from .progress import Sample, fetch, parse, to_progress
from .salvage import invalid_spec_status, salvage_status
from .tracking import TrackingReport, parse_report

log = logging.getLogger("finetune_operator")
EventSink = Callable[[Mapping[str, Any], Event], None]
PROGRESS_EVERY_SECONDS = 3.0
"""How often rank 0's metrics are read (one small HTTP GET per running job)."""
WARNING_AFTER_SECONDS = 20.0
"""A pod not running this long gets its newest Warning Event read (FailedAttachVolume, ...)."""
WARNING_EVERY_SECONDS = 15.0
"""How often a waiting pod's newest Warning Event is read again."""


def _hash_key(job: FineTuneJob, plan: PlanStatus) -> tuple[str, str]:
    """What the gang hash of a job follows, given the operator's options: its spec and its plan."""
    return (job.spec.model_dump_json(), plan.model_dump_json())


def plan_or_fail(
    spec: FineTuneJobSpec,
    access_modes: Callable[[str], tuple[str, ...] | None] | None = None,
    policy: SchedulingPolicy = SchedulingPolicy(),  # noqa: B008 (frozen, so one shared default is safe)
    source: Callable[[], ModelSource | None] = lambda: None,
) -> PlanStatus:
    """The plan, or PlanFailed (or PlanPending while `source` reads the model's config.json);
    `access_modes` reads a claim's access modes (multi-node jobs), `policy` is what this
    installation lets a job ask of the scheduler."""
    try:
        policy.check(spec)
        if access_modes is not None and spec.resources.num_nodes > 1:
            check_shared_storage(spec, {claim: access_modes(claim) for claim in written_claims(spec)})
        return choose_plan(spec, local_files=False, source=source())
    except PlanningError as exc:
        raise PlanFailed(exc.condition_reason, str(exc)) from exc


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
        hub: HubSettings = HubSettings(offline=True),  # noqa: B008 (frozen)
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`hub`: where public hub models are read (`ftjob operator` passes its flags; offline by default)."""
        self.cluster = cluster
        self.clock = clock
        """Read once per pass: every time a pass writes or compares comes from that one reading."""
        self.options = options
        self.policy = policy
        self.sink = sink
        self.sources = ModelSources(options, hub, read_config_map=cluster.read_config_map)
        self.census = metrics.JobCensus()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._samples: dict[str, Sample] = {}
        self._scraped_at: dict[str, float] = {}
        self._hashes: dict[str, tuple[tuple[str, str], str]] = {}
        self._written: dict[str, str] = {}
        self._warnings: dict[str, tuple[float, str | None]] = {}
        self.kueue = KueueWrites(cluster)

    def _desired_hash(self, job: FineTuneJob, plan: PlanStatus) -> str:
        """The gang hash, remembered per job from the last render (`_apply_children`), or rendered
        here when the spec or the plan changed since: every pass needs it, few render."""
        uid, key = job.metadata.uid or "", _hash_key(job, plan)
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
        self.sources.forget(uid)
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
        """One pass, in its phases: decide, and carry out what reading the model asked for; stop if
        idle; decide again on the newest job before acting on a running gang; store the verdict
        before scaling the gang away; apply the children; Kueue's Workload; the status, then
        deletions and events."""
        now = self.clock()
        meta = body.get("metadata", {})
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        decided = self._decide(body, observed, now)
        if not isinstance(decided, Decided):
            return self._write_invalid(decided, namespace)
        self._settle_model(decided.job)
        if not (apply_all or self._has_effects(decided, observed)):
            self._tally(decided)
            return Outcome(decided.decision, False, False, decided.decision.requeue_after)
        if self._acts_on_running_gang(decided, observed):
            # decide again on the newest object, never on a cache that may lag our own last status
            # write (that would restart a gang twice for one failure, or put back the plan a re-plan
            # after an OOM replaced)
            newest = self.cluster.read_job(namespace, name)
            if newest is None:
                return Outcome(None, False, False, None)
            decided = self._decide(newest, observed, now)
            if not isinstance(decided, Decided):
                return self._write_invalid(decided, namespace)
            self._settle_model(decided.job)
        stored_first = False
        if _scales_to_zero(observed, decided.decision) and decided.changed:
            stored = self._store_verdict(decided)
            if stored is None:
                return Outcome(decided.decision, False, False, None)  # lost a race: the next pass decides again
            decided, stored_first = stored, True
        decided, applied = self._apply_children(decided, apply_all, now)
        decided = self._apply_serving(decided, now)
        decided = self._write_workload(decided, observed, now)
        return self._write_and_delete(decided, observed, stored_first, applied)

    def _store_verdict(self, decided: Decided) -> Decided | None:
        """The verdict first: a finished gang's exit codes live only in its pods, which the
        scale-down deletes, so an operator killed between the two would find neither. Returns
        the job as written, or None when the write lost a race."""
        if not self._write_status(decided):
            return None
        return self._as_written(decided)

    def _apply_children(self, decided: Decided, apply_all: bool, now: datetime) -> tuple[Decided, bool]:
        """Render and server-side apply the children; a child that cannot be written becomes the
        decision's status (`child_write.amend`). Returns the decision and whether it applied."""
        job, decision = decided.job, decided.decision
        if decision.plan is None or not (apply_all or decided.needs_apply):
            return decided, False
        gang = render_gang(job, decision.plan, self.options, decision.replicas, placement=decision.placement)
        self._hashes[job.metadata.uid or ""] = (_hash_key(job, decision.plan), gang.hash)
        try:
            self.cluster.apply(gang.objects, job.metadata.uid or "")
        except ChildWriteError as exc:
            log.warning("job %s/%s: %s", job.namespace, job.name, exc)
            return decided.amended(child_write.amend(job, decision, exc, now)), False
        return decided, True

    def _apply_serving(self, decided: Decided, now: datetime) -> Decided:
        """Apply what serves the result (`Effects.serve`); one that cannot be applied becomes the
        `Serving` condition, retried later, never the job's failure."""
        job, decision = decided.job, decided.decision
        if not decision.serve:
            return decided
        try:
            self.cluster.apply_served(decision.serve, job.metadata.uid or "")
        except ChildWriteError as exc:
            log.warning("job %s/%s: serving: %s", job.namespace, job.name, exc)
            return decided.amended(serving.not_applied(job, decision, exc, now))
        return decided

    def _write_workload(self, decided: Decided, observed: Observed, now: datetime) -> Decided:
        """Kueue's side of the decision; a Workload that cannot be created becomes its status."""
        try:
            self.kueue.write(decided.job, decided.decision, observed.workload, now)
        except ChildWriteError as exc:
            log.warning("job %s/%s: %s", decided.job.namespace, decided.job.name, exc)
            return decided.amended(child_write.amend(decided.job, decided.decision, exc, now))
        return decided

    def _write_and_delete(self, decided: Decided, observed: Observed, stored_first: bool, applied: bool) -> Outcome:
        """The status, then the deletions it accounts for, then the events of what was written.

        The status (the counted failure, its fingerprint, the new plan) is written before the
        failed pods are deleted: an operator killed in between then finds the same failure
        already counted and only deletes, instead of finding new pods and no trace of it."""
        decision, body, job = decided.decision, decided.body, decided.job
        unchanged = not decided.changed
        wrote = self._write_status(decided) or stored_first
        if decision.delete_pods and (wrote or unchanged):
            self.cluster.delete_pods(job.namespace, [(p.name, p.uid) for p in observed.pods if not p.deleting])
        if wrote:
            for event in decision.events:
                self._count(job.namespace, event)
                self.sink(body, event)
        if decision.delete_job:
            self.cluster.delete_job(job.namespace, job.name)
            for event in decision.events:
                self.sink(body, event)
        self._tally(decided)
        return Outcome(decision, wrote, applied, decision.requeue_after)

    def _tally(self, change: StatusChange) -> None:
        """The job's headline state, gang restarts and state's start, for the operator's metrics."""
        meta, status = change.body.get("metadata", {}), change.decision.status
        self.census.record(
            str(meta.get("uid", "")),
            str(meta.get("namespace", "")),
            status.state,
            name=str(meta.get("name", "")),
            restarts=status.restarts,
            since=metrics.state_since(status, meta.get("creationTimestamp")),
        )

    def _settle_model(self, job: FineTuneJob) -> None:
        """What reading the model asked for: create the inspector pod, keep what was read in the job's
        `<job>-model` ConfigMap, delete an inspector pod that answered."""
        uid = job.metadata.uid or ""
        apply, delete = self.sources.take_effects(uid)
        if apply:
            try:
                self.cluster.apply(apply, uid)
            except ChildWriteError as exc:
                log.warning("job %s/%s: %s", job.namespace, job.name, exc)
                self.sources.write_failed(uid, str(exc))
        if delete:
            self.cluster.delete_pods(job.namespace, delete)

    def _replan(self, job: FineTuneJob, spec: FineTuneJobSpec, plan: PlanStatus) -> PlanStatus | None:
        """The next more frugal plan, with the config.json the job was planned with."""
        try:
            return next_frugal_plan(spec, plan, source=self.sources.known(job))
        except PlanningError as exc:  # the model record is gone and the spec alone cannot be planned
            log.warning("job %s/%s: cannot re-plan: %s", job.namespace, job.name, exc)
            return None

    def _decide(self, body: Mapping[str, Any], observed: Observed, now: datetime) -> Decided | StatusChange:
        """The decision on `body`; for a spec that does not validate, the Failed/InvalidSpec status."""
        status = salvage_status(body.get("status"))
        try:
            job = FineTuneJob.from_manifest({**body, "status": None})
        except ValidationError as exc:
            lines = describe(exc, FineTuneJob)
            invalid = Decision(replicas=0, plan=None, status=invalid_spec_status(status, lines, body, now))
            return StatusChange(body, invalid, serialised(invalid))
        job = job.model_copy(update={"status": status})
        namespace = job.metadata.namespace or ""
        progress, tracking = self._progress(job, observed, now)
        observed = self.kueue.with_flavors(self._with_warnings(namespace, observed, now))
        decision = decide(
            job,
            observed,
            now,
            planner=lambda spec: plan_or_fail(
                spec,
                lambda claim: self.cluster.claim_access_modes(namespace, claim),
                self.policy,
                lambda: self.sources.source(job, observed.inspector),
            ),
            replanner=lambda spec, plan: self._replan(job, spec, plan),
            desired_config_hash=lambda plan: self._desired_hash(job, plan),
            progress=progress,
            default_queue=self.options.default_queue_name,
            tracking_report=tracking,
        )
        needs_apply = self._needs_apply(job, observed, decision)
        return Decided(body, decision, serialised(decision), job=job, read_status=status, needs_apply=needs_apply)

    def _progress(self, job: FineTuneJob, observed: Observed, now: datetime) -> tuple[Any, TrackingReport | None]:
        """Rank 0's progress (the last one between scrapes) and, from a fresh scrape, its tracking report."""
        rank0 = next((p for p in observed.live_pods if p.ordinal == 0 and p.ip and p.phase == "Running"), None)
        uid = job.metadata.uid or ""
        if rank0 is None:
            return None, None
        at = now.timestamp()
        last = self._scraped_at.get(uid)
        if last is not None and at - last < PROGRESS_EVERY_SECONDS:
            return (job.status.progress if job.status else None), None
        # a failed read waits its turn too: an unreachable rank 0 costs one timeout per period, not per pass
        self._scraped_at[uid] = at
        text = fetch(f"http://{rank0.ip}:{self.options.metrics_port}/metrics")
        values = parse(text) if text is not None else None
        if text is None or values is None:
            return (job.status.progress if job.status else None), None
        sample = Sample(at=at, values=values)
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
                pods.append(replace(view, warning=self._warning(namespace, view.uid, now.timestamp())))
            else:
                pods.append(view)
        horizon = now.timestamp() - 600  # entries of pods gone for ten minutes
        for uid in [u for u, (at, _) in self._warnings.items() if at < horizon]:
            del self._warnings[uid]
        return replace(observed, pods=tuple(pods))

    def _warning(self, namespace: str, uid: str, now: float) -> str | None:
        at, last = self._warnings.get(uid, (0.0, None))
        if now - at < WARNING_EVERY_SECONDS:
            return last
        try:
            last = self.cluster.pod_warning(namespace, uid)
        except Exception:  # an explanation is optional: never fail a pass for it
            last = None
        self._warnings[uid] = (now, last)
        return last

    def _has_effects(self, decided: Decided, observed: Observed) -> bool:
        """Whether the decision changes anything: the status (beyond the progress's time), the
        children, the pods, the job or its Kueue Workload."""
        d = decided.decision
        changed = _without_progress_time(d.status) != _without_progress_time(decided.read_status)
        kueue = (d.workload is not None and observed.workload is None) or d.release_workload or d.delete_workload
        kueue = kueue or bool(d.finish_workload)
        return changed or kueue or d.delete_pods or d.delete_job or decided.needs_apply

    @staticmethod
    def _acts_on_running_gang(decided: Decided, observed: Observed) -> bool:
        """Whether the decision deletes pods or the job, or re-renders running workers."""
        d = decided.decision
        return d.delete_pods or d.delete_job or (observed.workers is not None and decided.needs_apply)

    def _needs_apply(self, job: FineTuneJob, observed: Observed, d: Decision) -> bool:
        if d.plan is None:
            return False
        workers = observed.workers
        desired = self._desired_hash(job, d.plan)
        return workers is None or workers.replicas != d.replicas or workers.config_hash != desired

    def _write_status(self, change: StatusChange) -> bool:
        """Every status write of a pass goes through here, guarded by the resourceVersion the
        decision was made on; False when nothing changed or the write lost a race."""
        if not change.changed:
            return False
        meta = change.body.get("metadata", {})
        try:
            written = self.cluster.patch_status(
                meta["namespace"], meta["name"], meta.get("resourceVersion"), status_patch(change.stored, change.wire)
            )
        except Conflict:  # JobGone too: no pass follows a deletion
            return False  # the next pass decides again on the newer object
        self._written[str(meta.get("uid", ""))] = written
        return True

    def _as_written(self, decided: Decided) -> Decided:
        """The decision on the job as this operator's last status write left it (its status, its new version)."""
        meta = dict(decided.body.get("metadata", {}))
        meta["resourceVersion"] = self._written.get(str(meta.get("uid", "")), meta.get("resourceVersion"))
        return replace(decided, body={**decided.body, "metadata": meta, "status": decided.wire})

    def is_own_write(self, uid: str, resource_version: str) -> bool:
        """Whether this version of the job is the status this operator just wrote: its watch
        event needs no pass (the pass that wrote it already decided on everything else)."""
        return bool(resource_version) and self._written.get(uid) == resource_version

    def _write_invalid(self, change: StatusChange, namespace: str) -> Outcome:
        decision = change.decision
        wrote = self._write_status(change)
        if wrote:
            failed = [c for c in decision.status.conditions if c.type == ConditionType.FAILED]
            self.sink(change.body, Event("Warning", R.INVALID_SPEC, failed[0].message if failed else "invalid spec"))
        self._tally(change)
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
