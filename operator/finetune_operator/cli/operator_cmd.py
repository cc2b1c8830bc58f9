"""`ftjob operator`: run the operator. Every option is a flag or an environment variable."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading

DEFAULT_IMAGE_ENV = "FTJOB_TRAINER_IMAGE"


def _positive_int(text: str) -> int:
    value = int(text) if text.strip().isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    from ..render.options import DEFAULT_TRAINER_IMAGE

    env = os.environ.get
    parser.add_argument(
        "--namespace",
        action="append",
        default=_env_list("FTJOB_WATCH_NAMESPACES"),
        help="namespace to watch (repeatable; env FTJOB_WATCH_NAMESPACES, comma-separated); default: all",
    )
    parser.add_argument("--trainer-image", default=env(DEFAULT_IMAGE_ENV, DEFAULT_TRAINER_IMAGE))
    parser.add_argument("--metrics-address", default=env("FTJOB_METRICS_ADDRESS", "0.0.0.0"))
    parser.add_argument("--metrics-port", type=int, default=int(env("FTJOB_METRICS_PORT", "8080")))
    parser.add_argument("--health-port", type=int, default=int(env("FTJOB_HEALTH_PORT", "8081")))
    parser.add_argument(
        "--master-port",
        type=int,
        default=int(env("FTJOB_MASTER_PORT", "29500")),
        help="the rendezvous port rank 0 of every job listens on (default 29500)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=float(env("FTJOB_RECONCILE_INTERVAL", "5")),
        help="seconds between passes over an active job (progress, deadlines); events act at once",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=env("FTJOB_RECONCILE_WORKERS", "16"),
        help="jobs reconciled in parallel (each job on one worker at a time)",
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        default=env("FTJOB_KUEUE", "") == "true",
        help="Kueue is installed: watch Workloads; jobs with spec.queueName start only when admitted",
    )
    parser.add_argument(
        "--default-queue-name",
        default=env("FTJOB_DEFAULT_QUEUE_NAME") or None,
        help="Kueue LocalQueue for jobs without spec.queueName (needs --kueue); default: such jobs are not queued",
    )
    parser.add_argument(
        "--default-tracking-uri",
        default=env("FTJOB_DEFAULT_TRACKING_URI") or None,
        help="MLflow tracking server (http:// or https:// URL, as trainer pods reach it) for jobs whose "
        "spec.tracking.mlflow names none; default: such jobs are not tracked",
    )
    parser.add_argument(
        "--hub-endpoint",
        default=env("HF_ENDPOINT") or None,
        help="the hub or mirror public models are read from, and trainer and inspector pods download from "
        "(env HF_ENDPOINT; default https://huggingface.co)",
    )
    parser.add_argument(
        "--hub-offline",
        action="store_true",
        default=env("FTJOB_HUB_OFFLINE", "") == "true" or env("HF_HUB_OFFLINE", "") in ("1", "true", "ON", "YES"),
        help="never read the hub: hub ids are planned from the catalogue "
        "(env FTJOB_HUB_OFFLINE=true, HF_HUB_OFFLINE=1)",
    )
    parser.add_argument(
        "--model-cache-storage-class",
        default=env("FTJOB_MODEL_CACHE_STORAGE_CLASS") or None,
        help="StorageClass of the per-pod model cache claims (default: the cluster's default class)",
    )
    parser.add_argument(
        "--download-timeout",
        type=_positive_int,
        default=env("FTJOB_DOWNLOAD_TIMEOUT_SECONDS", "7200"),
        help="seconds a trainer pod may spend downloading a hub model (apart from the rendezvous timeout)",
    )
    parser.add_argument(
        "--gpu-placement",
        choices=["memory", "product", "resource"],
        default=env("FTJOB_GPU_PLACEMENT", "memory"),
        help="how trainer pods find GPUs with the planned memory: GPU Feature Discovery's nvidia.com/gpu.memory "
        "label (memory, the default), nvidia.com/gpu.product (product), or the device plugin's nvidia.com/gpu "
        "resource alone (resource: clusters without GFD)",
    )
    parser.add_argument("--pod-monitor", action="store_true", default=env("FTJOB_POD_MONITOR", "") == "true")
    parser.add_argument(
        "--s3-endpoint", default=env("FTJOB_S3_DEFAULT_ENDPOINT") or None, help="default objectStorage.endpoint"
    )
    parser.add_argument("--s3-region", default=env("FTJOB_S3_DEFAULT_REGION") or None, help="default region")
    parser.add_argument(
        "--s3-path-style",
        action="store_true",
        default=env("FTJOB_S3_DEFAULT_PATH_STYLE", "") == "true",
        help="address buckets path-style by default (most on-premises stores)",
    )
    parser.add_argument(
        "--s3-ca-bundle",
        metavar="CONFIGMAP/KEY",
        default=env("FTJOB_S3_DEFAULT_CA_BUNDLE") or None,
        help="default CA bundle: a ConfigMap key in each job's namespace",
    )
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster, then ~/.kube/config")
    parser.add_argument(
        "--allowed-priority-class",
        action="append",
        default=[],
        help="a priority class jobs may use (repeat; none given: any class but system-*)",
    )
    parser.add_argument(
        "--allowed-toleration-key",
        action="append",
        default=[],
        help="a taint key jobs may tolerate (repeat; none given: any key)",
    )
    parser.add_argument(
        "--allow-tolerate-all",
        action="store_true",
        help="let jobs tolerate every taint (a toleration without a key and operator Exists)",
    )
    parser.add_argument(
        "--allow-service-account-token-volumes",
        action="store_true",
        help="let jobs mount a projected serviceAccountToken volume (spec.podTemplate.volumes), which gives their "
        "pods an apiserver token",
    )
    parser.add_argument("--verbose", action="store_true")


def _load_kube_config(path: str | None, connections: int) -> None:
    from kubernetes import client, config

    if path:
        os.environ["KUBECONFIG"] = path  # kopf's own login reads the same file
        config.load_kube_config(config_file=path)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
    # one kept-alive connection per worker: a smaller pool opens (TLS handshake) and drops
    # a connection for every call beyond it under load
    settings = client.Configuration.get_default_copy()
    settings.connection_pool_maxsize = connections
    client.Configuration.set_default(settings)


RECURSION_LIMIT = 30_000
"""Python frames allowed. The apiserver admits JSON nested 10,000 deep where a schema keeps
unknown fields (spec.deepspeed.overrides: its CEL cannot type such values, so no rule can refuse
them), and kopf decodes, copies and encodes every object it watches: at Python's default of
1,000 one such FineTuneJob stopped the watch, and with it the operator, for every job."""
THREAD_STACK_BYTES = 64 * 1024 * 1024
"""C stack of the threads started after `run` begins (kopf's executor, the reconcile workers),
so the deeper recursion above fits in C as well (8 MiB held 50,000 levels of json in a test)."""


def _allow_deep_objects() -> None:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))
    threading.stack_size(THREAD_STACK_BYTES)


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    from .operator_settings import OperatorSettings

    settings = OperatorSettings.from_args(args)
    import kopf
    from prometheus_client import start_http_server

    from ..handlers.registry import build_registry, post_event
    from ..reconcile import metrics
    from ..reconcile.cluster_io import KubernetesClusterIO
    from ..reconcile.runner import Reconciler

    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    if not settings.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event is noise
    _allow_deep_objects()
    _load_kube_config(settings.kubeconfig, connections=settings.connections)
    metrics.initialise(settings.namespaces)
    start_http_server(settings.metrics_port, addr=settings.metrics_address)
    reconciler = Reconciler(KubernetesClusterIO(), settings.render, post_event, settings.policy, settings.hub)
    registry = build_registry(reconciler, settings.handlers)
    asyncio.run(kopf.operator(registry=registry, standalone=True, stop_flag=stop, **settings.kopf_operator_args()))
    return 0
