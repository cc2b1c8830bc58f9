"""Where the operator gets the config.json a job is planned with, and the conditions while it cannot.

- **A public hub id** (`org/name`, `hf://org/name@rev`, no `hfTokenSecretRef`): the operator reads
  config.json and the file listing itself, through `huggingface_hub` at the configured endpoint
  (a mirror works). Results are cached by (endpoint, repo, revision): a commit hash for good, a
  branch or tag for `BRANCH_TTL_SECONDS`.
- **A hub id with `hfTokenSecretRef`, or a `pvc://` model**: the operator reads no Secret and
  mounts no claim, so an inspector pod does (`render/model_inspector.py`); the job waits
  `Planned=False/InspectingModel` while it runs, and the operator deletes it once it answered.
- **`model.architecture`, a path in the image, `builtin://`**, or a hub with `--hub-offline`: the
  planner resolves it itself (the catalogue, a local folder), as `ftjob plan` does.

A hub that does not answer is retried with backoff (`Planned=False/HubUnreachable` says when);
a model the catalogue knows is planned from the catalogue meanwhile. Every other failure (not
found, gated without a token, a refused token, not a causal LM, a model_type the image does not
know) fails the job with its own reason and a message naming the field to fix.

What was read is kept in the job's `<job>-model` ConfigMap: later plans of the job (a re-plan
after an out-of-memory error, a new numNodes, an operator restart) count the same config.json
without reading the model again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..api.job import FineTuneJob
from ..api.model_inspection import RETRIED, ModelInspection
from ..api.model_uri import HubModel, claim_model, hub_model
from ..api.reasons import HUB_UNREACHABLE, INSPECTING_MODEL, INSPECTION_FAILED
from ..plan.errors import PlanningError
from ..plan.sources.model_files import read_hub
from ..plan.sources.model_source import ModelSource, from_inspection, resolve_reference
from ..render.model_inspector import (
    inspector_name,
    inspector_pod,
    model_record,
    model_request,
    read_record,
    record_name,
)
from ..render.options import DEFAULT_HUB_ENDPOINT, RenderOptions
from .decision import PlanFailed, PlanPending
from .observed import PodView

log = logging.getLogger("finetune_operator")

BRANCH_TTL_SECONDS = 600.0
"""How long a read of a branch or tag (not a commit) is reused: the branch may move."""
BACKOFF_SECONDS = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)
"""Waits before each further try of a hub that did not answer."""
POLL_SECONDS = 5.0


@dataclass(frozen=True)
class HubSettings:
    """The hub the operator reads public models from (a mirror: its URL), or none (offline)."""

    endpoint: str = DEFAULT_HUB_ENDPOINT
    offline: bool = False


HubReader = Callable[[HubModel, str], ModelInspection]
"""(model, endpoint) → what a public read found; `plan.model_files.read_hub` without a token."""


def _public_read(model: HubModel, endpoint: str) -> ModelInspection:
    return read_hub(model, endpoint=endpoint, token=None)


@dataclass
class _Backoff:
    attempts: int = 0
    next_at: float = 0.0
    message: str = ""


@dataclass
class _Effects:
    apply: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)


class ModelSources:
    """The model config of each job: read once, kept in memory and in the job's ConfigMap."""

    def __init__(
        self,
        options: RenderOptions,
        hub: HubSettings = HubSettings(),
        *,
        read_config_map: Callable[[str, str], dict[str, Any] | None],
        hub_reader: HubReader = _public_read,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options, self.hub, self.clock = options, hub, clock
        self._read_config_map, self._hub_reader = read_config_map, hub_reader
        self._lock = threading.Lock()
        self._reading: dict[tuple[str, str, str], threading.Lock] = {}
        self._jobs: dict[str, tuple[str, ModelInspection]] = {}
        self._checked: set[tuple[str, str]] = set()
        self._public: dict[tuple[str, str, str], tuple[float, ModelInspection]] = {}
        self._backoff: dict[object, _Backoff] = {}
        self._effects: dict[str, _Effects] = {}
        self._write_errors: dict[str, str] = {}

    # -- what the reconciler asks -----------------------------------------------------------
    def mode(self, job: FineTuneJob) -> str | None:
        """`hub` (read here), `inspect` (an inspector pod reads it) or None (the planner resolves it)."""
        model = job.spec.model
        if model.architecture:
            return None
        if claim_model(model.uri) is not None:
            return "inspect"
        if hub_model(model.uri) is None or self.hub.offline:
            return None
        return "inspect" if job.spec.hf_token_secret_ref is not None else "hub"

    def source(self, job: FineTuneJob, inspector: PodView | None) -> ModelSource | None:
        """The config the job is planned with; None when the planner resolves it from the spec.
        Raises PlanPending while it is being read, PlanFailed when it cannot be."""
        mode = self.mode(job)
        if mode is None:
            return None
        known = self.known(job)
        if known is not None:
            if inspector is not None and not inspector.deleting:
                self._queue(job).delete.append((inspector.name, inspector.uid))
            return known
        if mode == "hub":
            return self._from_hub(job)
        return self._from_inspector(job, inspector)

    def known(self, job: FineTuneJob) -> ModelSource | None:
        """What was read for the job's current model (memory, else its ConfigMap), never reading the model."""
        uid, request = job.metadata.uid or "", model_request(job)
        with self._lock:
            held = self._jobs.get(uid)
            if held is not None and held[0] == request:
                return from_inspection(held[1])
            if (uid, request) in self._checked:
                return None
        found = read_record(job, self._read_config_map(job.namespace, record_name(job)))
        with self._lock:
            self._checked.add((uid, request))
            if found is None:
                return None
            self._jobs[uid] = (request, found)
        return from_inspection(found)

    def take_effects(self, uid: str) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """Objects to apply (an inspector pod, a model record) and pods to delete, once each."""
        with self._lock:
            effects = self._effects.pop(uid, _Effects())
        return effects.apply, effects.delete

    def write_failed(self, uid: str, message: str) -> None:
        """Applying an effect failed (e.g. the inspector pod was refused): the next pass says why."""
        with self._lock:
            self._write_errors[uid] = message

    def forget(self, uid: str) -> None:
        with self._lock:
            self._jobs.pop(uid, None)
            self._effects.pop(uid, None)
            self._write_errors.pop(uid, None)
            self._backoff.pop(uid, None)
            self._checked = {key for key in self._checked if key[0] != uid}

    # -- reading ------------------------------------------------------------------------------
    def _queue(self, job: FineTuneJob) -> _Effects:
        with self._lock:
            return self._effects.setdefault(job.metadata.uid or "", _Effects())

    def _found(self, job: FineTuneJob, inspection: ModelInspection) -> ModelSource:
        source = from_inspection(inspection)
        with self._lock:
            self._jobs[job.metadata.uid or ""] = (model_request(job), inspection)
            self._backoff.pop(job.metadata.uid or "", None)
        self._queue(job).apply.append(model_record(job, inspection))
        return source

    def _wait(self, key: object, message: str) -> PlanPending:
        """Count a retried failure and say when the next try is."""
        with self._lock:
            backoff = self._backoff.setdefault(key, _Backoff())
            delay = BACKOFF_SECONDS[min(backoff.attempts, len(BACKOFF_SECONDS) - 1)]
            backoff.attempts += 1
            backoff.next_at = self.clock() + delay
            backoff.message = message
        return PlanPending(HUB_UNREACHABLE, f"{message}; retrying in {delay:.0f} s (try {backoff.attempts})", delay)

    def _backing_off(self, key: object) -> PlanPending | None:
        with self._lock:
            backoff = self._backoff.get(key)
            left = backoff.next_at - self.clock() if backoff is not None else 0.0
        if backoff is None or left <= 0:
            return None
        return PlanPending(HUB_UNREACHABLE, f"{backoff.message}; retrying in {left:.0f} s (try {backoff.attempts})",
                           left)  # fmt: skip

    def _from_hub(self, job: FineTuneJob) -> ModelSource:
        model = hub_model(job.spec.model.uri, job.spec.model.revision)
        assert model is not None
        key = (self.hub.endpoint, model.repo, model.revision_or_default)
        with self._lock:
            lock = self._reading.setdefault(key, threading.Lock())
        with lock:  # one read per model, however many jobs name it at once
            cached = self._cached(key)
            if cached is None:
                waiting = self._backing_off(key)
                if waiting is not None:
                    return self._fallback(model, waiting)
                cached = self._hub_reader(model, self.hub.endpoint)
                if cached.failure is None:
                    with self._lock:
                        self._public[key] = (self.clock(), cached)
                        self._backoff.pop(key, None)
        if cached.failure is None:
            return self._found(job, cached)
        if cached.failure in RETRIED:
            return self._fallback(model, self._wait(key, cached.message or HUB_UNREACHABLE))
        raise PlanFailed(cached.failure, cached.message or cached.failure)

    def _cached(self, key: tuple[str, str, str]) -> ModelInspection | None:
        with self._lock:
            held = self._public.get(key)
        if held is None:
            return None
        at, inspection = held
        pinned = inspection.commit is not None and inspection.commit == key[2]
        return inspection if pinned or self.clock() - at < BRANCH_TTL_SECONDS else None

    def _fallback(self, model: HubModel, waiting: PlanPending) -> ModelSource:
        """The catalogue's copy of a hub model the endpoint did not serve, else wait for the hub."""
        try:
            found = resolve_reference(model.repo, "spec.model.uri", local_files=False)
        except PlanningError:
            raise waiting from None
        log.warning("planning %s from the catalogue: %s", model, waiting)
        return ModelSource(found.name, found.config, f"{found.origin} ({self.hub.endpoint} did not answer)")

    def _from_inspector(self, job: FineTuneJob, pod: PodView | None) -> ModelSource:
        uid, request, name = job.metadata.uid or "", model_request(job), inspector_name(job)
        where = str(claim_model(job.spec.model.uri) or hub_model(job.spec.model.uri, job.spec.model.revision))
        with self._lock:
            refused = self._write_errors.pop(uid, None)
        if refused is not None:
            raise PlanPending(INSPECTING_MODEL, f"cannot create the inspector pod {name}: {refused}", POLL_SECONDS * 6)
        if pod is not None and pod.model_request != request and not pod.deleting:
            self._queue(job).delete.append((pod.name, pod.uid))  # inspected an older spec
            pod = None
        if pod is None:
            waiting = self._backing_off(uid)
            if waiting is not None:
                raise waiting
            self._queue(job).apply.append(inspector_pod(job, self.options))
            raise PlanPending(INSPECTING_MODEL, f"pod {name} reads config.json from {where}", POLL_SECONDS)
        if pod.deleting:
            raise PlanPending(INSPECTING_MODEL, f"waiting for the previous inspector pod {name} to stop", POLL_SECONDS)
        term = pod.terminated
        if term is None:
            stuck = pod.unschedulable or pod.waiting or pod.warning
            detail = f"; {stuck}" if stuck else ""
            raise PlanPending(INSPECTING_MODEL, f"pod {name} reads config.json from {where}{detail}", POLL_SECONDS)
        self._queue(job).delete.append((pod.name, pod.uid))
        result = ModelInspection.from_message(term.message)
        if result is None:
            tail = term.message.strip()[-600:] or term.reason or "no message"
            why = f"inspector pod {name} exited {term.exit_code} without a verdict: {tail}"
            raise PlanFailed(INSPECTION_FAILED, why)
        if result.failure is None:
            return self._found(job, result)
        if result.failure in RETRIED:
            raise self._wait(uid, result.message or result.failure)
        raise PlanFailed(result.failure, result.message or result.failure)
