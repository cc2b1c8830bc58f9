"""The kopf wiring: thin handlers that hand every FineTuneJob to the Reconciler.

Pods and StatefulSets carrying our job label are kept in kopf indexes, so a
reconciliation reads its children from memory. Create, resume and spec updates
re-apply everything; a timer reconciles every few seconds to follow pods, progress,
deadlines and TTLs. Handler progress lives in annotations, never in our status.
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
from ..reconcile.runner import Outcome, Reconciler
from ..render.identity import JOB_NAME_LABEL

log = logging.getLogger("finetune_operator")


@dataclass(frozen=True)
class HandlerSettings:
    interval_seconds: float = 5.0
    max_workers: int = 8


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


def _plain(body: Any) -> dict[str, Any]:
    return {
        "metadata": dict(body.get("metadata", {})),
        "spec": dict(body.get("spec", {}) or {}),
        "status": dict(body.get("status", {}) or {}),
    }


def _first(values: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
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
        return {(kw["namespace"], kw["labels"][JOB_NAME_LABEL]): _plain(kw["body"])}

    @kopf.index(
        "apps", "v1", "statefulsets", labels={JOB_NAME_LABEL: kopf.PRESENT}, id="workers_by_job", registry=registry
    )
    def workers_by_job(**kw: Any) -> dict[Any, Any]:
        return {(kw["namespace"], kw["labels"][JOB_NAME_LABEL]): _plain(kw["body"])}

    def run(kw: Mapping[str, Any], apply_all: bool) -> Outcome:
        key = (kw["namespace"], kw["name"])
        pods = list(kw["pods_by_job"].get(key, []))
        workers = _first(kw["workers_by_job"].get(key, []))
        try:
            return reconciler.reconcile(dict(kw["body"]), pods, workers, apply_all=apply_all)
        except ApiException as exc:
            raise kopf.TemporaryError(f"apiserver said {exc.status} {exc.reason}", delay=2) from exc

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)
    def reconcile_spec(**kw: Any) -> None:
        run(kw, apply_all=True)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=settings.interval_seconds, registry=registry)
    def follow(**kw: Any) -> None:
        run(kw, apply_all=False)

    @kopf.on.delete(GROUP, VERSION, PLURAL, optional=True, registry=registry)
    def forget(**kw: Any) -> None:
        reconciler.forget(kw["uid"])

    @kopf.on.probe(id="reconciler", registry=registry)
    def reconciler_alive(**_kw: Any) -> str:
        return "ok"

    return registry
