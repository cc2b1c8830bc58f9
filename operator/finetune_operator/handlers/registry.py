"""The kopf wiring: thin handlers that hand every FineTuneJob to the Reconciler.

Pods and StatefulSets carrying our job label are kept in kopf indexes (as the small
views decisions need), so a reconciliation reads its children from memory. Every event
of a job is reconciled (level-based, idempotent, no API call when nothing changes); a
timer follows pods, progress, deadlines and TTLs; resume re-applies every child once
after an operator restart. No kopf progress annotations are written per change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..api.job import GROUP, PLURAL, VERSION
from ..reconcile.lifecycle import Event
from ..reconcile.observed import Observed, WorkersView, pod_view, workers_view
from ..reconcile.runner import Outcome, Reconciler
from ..render.identity import JOB_NAME_LABEL

log = logging.getLogger("finetune_operator")


@dataclass(frozen=True)
class HandlerSettings:
    interval_seconds: float = 5.0
    max_workers: int = 32


def post_event(body: Mapping[str, Any], event: Event) -> None:
    kopf.event(
        kopf.Body(cast(kopf.RawBody, dict(body))), type=event.type, reason=event.reason, message=event.message[:1024]
    )


def connection_from_client() -> kopf.ConnectionInfo:
    """kopf's credentials from the already configured kubernetes client.

    The client was set up once from --kubeconfig, in-cluster config or ~/.kube/config;
    kopf must talk to the same cluster with the same identity.
    """
    config = client.Configuration.get_default_copy()
    token = (config.api_key or {}).get("authorization") or (config.api_key or {}).get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[len("bearer ") :]
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        scheme="Bearer" if token else None,
        token=token or None,
    )


def _first(values: Iterable[WorkersView]) -> WorkersView | None:
    return next(iter(values), None)


def build_registry(reconciler: Reconciler, settings: HandlerSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_kw: Any) -> kopf.ConnectionInfo:
        return connection_from_client()

    @kopf.on.startup(registry=registry)
    def configure(**kw: Any) -> None:
        settings: kopf.OperatorSettings = kw["settings"]
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="finetune.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="finetune.dev", key="last-handled-configuration"
        )
        settings.posting.level = logging.CRITICAL  # our own events only, not kopf's log lines
        settings.scanning.disabled = True  # no CRD/namespace watching: RBAC stays minimal
        settings.execution.max_workers = handler_settings.max_workers
        settings.watching.server_timeout = 270
        settings.networking.request_timeout = 30

    handler_settings = settings

    @kopf.index("pods", labels={JOB_NAME_LABEL: kopf.PRESENT}, id="pods_by_job", registry=registry)
    def pods_by_job(**kw: Any) -> dict[Any, Any]:
        # only the small view the decisions need is kept: memory stays flat with many jobs
        return {(kw["namespace"], kw["labels"][JOB_NAME_LABEL]): pod_view(kw["body"])}

    @kopf.index(
        "apps", "v1", "statefulsets", labels={JOB_NAME_LABEL: kopf.PRESENT}, id="workers_by_job", registry=registry
    )
    def workers_by_job(**kw: Any) -> dict[Any, Any]:
        return {(kw["namespace"], kw["labels"][JOB_NAME_LABEL]): workers_view(kw["body"])}

    def run(kw: Mapping[str, Any], apply_all: bool) -> Outcome:
        key = (kw["namespace"], kw["name"])
        observed = Observed(
            workers=_first(kw["workers_by_job"].get(key, [])), pods=tuple(kw["pods_by_job"].get(key, []))
        )
        try:
            return reconciler.reconcile(dict(kw["body"]), observed, apply_all=apply_all)
        except ApiException as exc:
            raise kopf.TemporaryError(f"apiserver said {exc.status} {exc.reason}", delay=2) from exc

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def on_change(**kw: Any) -> None:
        # level-based: every change of a job (spec, status, our own writes) is reconciled;
        # a pass with nothing to do makes no API call
        if (kw.get("type") or "") == "DELETED":
            reconciler.forget(kw["uid"])
            return
        run(kw, apply_all=False)

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    def on_resume(**kw: Any) -> None:
        run(kw, apply_all=True)  # after an operator restart, re-assert every child once

    @kopf.timer(GROUP, VERSION, PLURAL, interval=settings.interval_seconds, registry=registry)
    def follow(**kw: Any) -> None:
        run(kw, apply_all=False)  # pods, progress, deadlines and TTLs change without a job event

    @kopf.on.probe(id="reconciler", registry=registry)
    def reconciler_alive(**_kw: Any) -> str:
        return "ok"

    return registry
