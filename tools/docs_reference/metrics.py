"""The metrics page: every Prometheus series the trainer and the operator export.

The trainer's collectors are built as a rank builds them (`RankMetrics`, rank 0's tracking
collector, the pod's download gauges) into a fresh registry; the operator's are its module-level
metrics. Names, types, labels and help texts are read off those objects, so the page lists what
a scrape can see, in the words of the code. Series are sorted by name within each exporter.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from . import cell

# The labels of finetune_trainer_info are the keys of the dict the rank passes (worker.py).
TRAINER_INFO_LABELS = {"rank": "0", "local_rank": "0", "zero_stage": "2", "method": "lora", "UUID": ""}


@dataclass(frozen=True)
class Series:
    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def _exposed(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def series_of(collector: Collector) -> list[Series]:
    """The series one registered collector exports: a metric object's own fields, or a custom collector's families."""
    if isinstance(collector, MetricWrapperBase):
        kind = collector._type or "untyped"
        return [Series(_exposed(collector._name, kind), kind, tuple(collector._labelnames), collector._documentation)]
    found = []
    for family in collector.collect():
        labels = tuple(getattr(family, "_labelnames", ()))
        if not labels and family.samples:
            labels = tuple(k for k in family.samples[0].labels if k != "le")
        found.append(Series(_exposed(family.name, family.type), family.type, labels, family.documentation))
    return found


def registry_series(registry: CollectorRegistry) -> list[Series]:
    collectors = list(registry._collector_to_names)
    return sorted((s for c in collectors for s in series_of(c)), key=lambda s: s.name)


def trainer_series() -> list[Series]:
    from finetune_trainer.metrics.rank import RankMetrics
    from finetune_trainer.metrics.tracking import TrackingCollector
    from finetune_trainer.pod.prefetch import download_gauges
    from finetune_trainer.tracking.status import SinkState, StatusBoard, TrackingStatus

    registry = CollectorRegistry()
    RankMetrics(registry, dict(TRAINER_INFO_LABELS), on_gpu=True, planned={}, comm=False)
    download_gauges(registry)
    with tempfile.TemporaryDirectory() as folder:  # the tracking collector exports once its status file exists
        status = Path(folder) / "tracking.status"
        board = StatusBoard(status, TrackingStatus(sinks={"mlflow": SinkState()}))
        board.write(force=True)
        registry.register(TrackingCollector(status))
        return registry_series(registry)


def operator_series() -> list[Series]:
    from finetune_operator.reconcile import metrics

    registry = CollectorRegistry()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            registry.register(value)
    return registry_series(registry)


def _table(series: list[Series]) -> list[str]:
    lines = ["| Name | Type | Labels | Help |", "|---|---|---|---|"]
    for s in series:
        labels = ", ".join(f"`{label}`" for label in s.labels)
        lines.append(f"| `{s.name}` | {s.type} | {labels} | {cell(s.help)} |")
    return lines


def page() -> str:
    lines = [
        "# Metrics",
        "",
        "## Trainer (`finetune_` prefix)",
        "",
        "Each rank serves `/metrics` on port 9400 + its local rank (a pod downloading a hub model serves the "
        "download gauges on the same port before its ranks start; rank 0 adds the tracking series). "
        "Histograms expose `_bucket`, `_sum` and `_count`. `finetune_trainer_info` is labelled with the rank's "
        "facts: " + ", ".join(f"`{k}`" for k in TRAINER_INFO_LABELS) + ". GPU allocator series are empty on CPU ranks.",
        "",
    ]
    lines += _table(trainer_series())
    lines += [
        "",
        "## Operator (`finetune_operator_` prefix)",
        "",
        "Served by `ftjob operator` on its metrics port (the chart's metrics Service). Names follow "
        "controller-runtime's; every label combination known at start-up exists from the start.",
        "",
    ]
    lines += _table(operator_series())
    return "\n".join(lines) + "\n"
