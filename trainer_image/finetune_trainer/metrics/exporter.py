"""Serving a rank's metrics over HTTP: port = FTJOB_METRICS_PORT (default 9400) + local rank.

Bound to FTJOB_POD_IP (default 127.0.0.1) so only the pod network sees it. A port that
is taken is logged and skipped: metrics must never stop a training run. Setting
FTJOB_METRICS_PORT=off disables the exporter (useful when many runs share a machine).
"""

from __future__ import annotations

import logging
import os

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

DEFAULT_PORT = 9400


class _ProcessRss(Collector):
    """Resident memory of this rank (the CPU stand-in for allocator statistics)."""

    def collect(self):  # type: ignore[no-untyped-def]
        try:
            import psutil  # type: ignore[import-untyped]

            rss = float(psutil.Process().memory_info().rss)
        except Exception:  # optional dependency, never fatal
            return
        yield GaugeMetricFamily("finetune_process_resident_memory_bytes", "RSS of this rank's process.", value=rss)


def new_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_ProcessRss())
    return registry


def metrics_port(local_rank: int) -> int | None:
    raw = os.environ.get("FTJOB_METRICS_PORT", str(DEFAULT_PORT))
    if raw.lower() in ("off", "none", ""):
        return None
    return int(raw) + local_rank


def serve(registry: CollectorRegistry, local_rank: int) -> int | None:
    """Start the HTTP exporter in a daemon thread; returns the port or None."""
    port = metrics_port(local_rank)
    if port is None:
        return None
    address = os.environ.get("FTJOB_POD_IP", "127.0.0.1")
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        log.warning("metrics exporter not started on %s:%d: %s", address, port, exc)
        return None
    return port
