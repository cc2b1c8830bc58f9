"""The operator's own options as one typed, frozen value, built once from the parsed flags.

`ftjob operator`'s parser (`operator_cmd.configure`) declares the flags, each with its
environment variable as the default; `OperatorSettings.from_args` checks them and turns them
into the values the parts of the operator take (what it renders, the hub it reads, what jobs may
ask of the scheduler, the work queue), so nothing past this point reads `args`. What kopf itself
is told lives with the handlers (`handlers.registry.kopf_settings`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..api.base import HTTP_URL_HINT, HTTP_URL_PATTERN
from ..api.object_storage import ObjectStorageSpec
from ..api.tracking import tracking_uri_problem
from ..render.options import DEFAULT_HUB_ENDPOINT, GpuPlacement, RenderOptions

if TYPE_CHECKING:  # imported when the operator starts, not when `ftjob` parses its flags
    from ..handlers.dispatch import HandlerSettings
    from ..plan.admission.scheduling_policy import SchedulingPolicy
    from ..reconcile.model_sources import HubSettings


def object_storage_defaults(args: argparse.Namespace) -> ObjectStorageSpec:
    """The --s3-* flags as the defaults every job's spec.objectStorage is laid over."""
    ca = None
    if args.s3_ca_bundle:
        name, _, key = args.s3_ca_bundle.partition("/")
        ca = {"name": name, "key": key}
    wire = {"endpoint": args.s3_endpoint, "region": args.s3_region, "pathStyle": args.s3_path_style or None}
    try:
        return ObjectStorageSpec.from_wire({k: v for k, v in {**wire, "caBundle": ca}.items() if v is not None})
    except ValueError as exc:
        raise SystemExit(f"--s3-* flags: {' '.join(str(exc).split())[:400]}") from None


def render_options(args: argparse.Namespace) -> RenderOptions:
    """The flags that shape what the operator renders for every job."""
    return RenderOptions(
        trainer_image=args.trainer_image,
        master_port=args.master_port,
        pod_monitor=args.pod_monitor,
        default_queue_name=args.default_queue_name,
        default_tracking_uri=args.default_tracking_uri,
        object_storage=object_storage_defaults(args),
        hub_endpoint=args.hub_endpoint,
        model_cache_storage_class=args.model_cache_storage_class,
        download_timeout_seconds=args.download_timeout,
        gpu_placement=GpuPlacement(args.gpu_placement),
    )


def _check(args: argparse.Namespace) -> None:
    """Flags that parse but do not go together, refused before anything starts."""
    if args.default_queue_name and not args.kueue:
        raise SystemExit("ftjob operator: --default-queue-name needs --kueue (Kueue installed)")
    problem = tracking_uri_problem(args.default_tracking_uri)
    if problem:
        raise SystemExit(f"ftjob operator: --default-tracking-uri: {problem}")
    if args.hub_endpoint and not re.fullmatch(HTTP_URL_PATTERN, args.hub_endpoint):
        raise SystemExit(f"ftjob operator: --hub-endpoint: invalid value {args.hub_endpoint!r}: {HTTP_URL_HINT}")


@dataclass(frozen=True)
class OperatorSettings:
    """Everything `ftjob operator` was told, by flag or environment variable."""

    namespaces: tuple[str, ...]
    """Watched namespaces; empty: the whole cluster."""
    metrics_address: str
    """Where the metrics and the liveness probe listen."""
    metrics_port: int
    health_port: int
    kubeconfig: str | None
    """None: in-cluster, then ~/.kube/config."""
    verbose: bool
    render: RenderOptions
    hub: HubSettings
    policy: SchedulingPolicy
    handlers: HandlerSettings

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OperatorSettings:
        """The settings, or SystemExit naming the flag that is wrong."""
        _check(args)
        from ..handlers.dispatch import HandlerSettings
        from ..plan.admission.scheduling_policy import SchedulingPolicy
        from ..reconcile.model_sources import HubSettings

        return cls(
            namespaces=tuple(args.namespace),
            metrics_address=args.metrics_address,
            metrics_port=args.metrics_port,
            health_port=args.health_port,
            kubeconfig=args.kubeconfig,
            verbose=args.verbose,
            render=render_options(args),
            hub=HubSettings(endpoint=(args.hub_endpoint or DEFAULT_HUB_ENDPOINT).rstrip("/"), offline=args.hub_offline),
            policy=SchedulingPolicy(
                priority_classes=tuple(args.allowed_priority_class),
                toleration_keys=tuple(args.allowed_toleration_key),
                tolerate_everything=args.allow_tolerate_all,
                token_volumes=args.allow_service_account_token_volumes,
            ),
            handlers=HandlerSettings(interval_seconds=args.interval, max_workers=args.workers, kueue=args.kueue),
        )

    @property
    def connections(self) -> int:
        """Kept-alive apiserver connections: one per reconcile worker, and two for the rest."""
        return self.handlers.max_workers + 2

    def kopf_operator_args(self) -> dict[str, Any]:
        """`kopf.operator`'s scope and liveness probe."""
        return {
            "clusterwide": not self.namespaces,
            "namespaces": list(self.namespaces),
            "liveness_endpoint": f"http://{self.metrics_address}:{self.health_port}/healthz",
        }
