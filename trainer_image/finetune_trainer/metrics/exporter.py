"""Serving a rank's metrics over HTTP: port = FTJOB_METRICS_PORT (default 9400) + local rank.

Bound to FTJOB_POD_IP (default 127.0.0.1) so only the pod network sees it. A port that
is taken is logged and skipped: metrics must never stop a training run. Setting
FTJOB_METRICS_PORT=off disables the exporter (useful when many runs share a machine);
FTJOB_METRICS=off disables collection altogether.
"""

from __future__ import annotations

import logging
import os

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from finetune_operator.api.pod_env import PodEnv

log = logging.getLogger(__name__)

DEFAULT_PORT = 9400


def new_registry() -> CollectorRegistry:
    """A rank's private registry with prometheus-client's ProcessCollector (process_* series:
    resident memory, CPU seconds, open fds), which the dashboards' pod row uses."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


def metrics_enabled() -> bool:
    """FTJOB_METRICS=off turns every metric and the communication accounting off (benchmarks)."""
    return os.environ.get("FTJOB_METRICS", "on").lower() not in ("off", "0", "false")


def metrics_port(local_rank: int) -> int | None:
    raw = os.environ.get(PodEnv.FTJOB_METRICS_PORT, str(DEFAULT_PORT))
    if raw.lower() in ("off", "none", ""):
        return None
    return int(raw) + local_rank


def serve(registry: CollectorRegistry, local_rank: int) -> int | None:
    """Start the HTTP exporter in a daemon thread; returns the port or None."""
    port = metrics_port(local_rank)
    if port is None:
        return None
    address = os.environ.get(PodEnv.FTJOB_POD_IP, "127.0.0.1")
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        log.warning("metrics exporter not started on %s:%d: %s", address, port, exc)
        return None
    return port
