"""Rank 0's tracking series: the job's MLflow run and each sink's health, for the operator.

The publishers run in the pod's entrypoint and leave their state in a small file
(`tracking.status`); this collector reads it at each scrape (never during a step) and
exports it under the names the operator parses (`finetune_operator.api.tracking`):
`finetune_tracking_info` (value 1; the run's id, experiment, URL, tracking URI and
TensorBoard folder as labels: one series per job), `finetune_tracking_failing{sink,reason}`
and `finetune_tracking_pending_records{sink}`, plus `finetune_tracking_published_step{sink}`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from finetune_operator.api.tracking import TRACKING_FAILING_METRIC, TRACKING_INFO_METRIC, TRACKING_PENDING_METRIC
from finetune_trainer.tracking.status import TrackingStatus


class TrackingCollector(Collector):
    def __init__(self, status_file: Path) -> None:
        self.status_file = status_file

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = TrackingStatus.read(self.status_file)
        if status is None:
            return
        labels = ["run_id", "experiment_id", "run_url", "tracking_uri", "tensorboard_dir"]
        info = GaugeMetricFamily(
            TRACKING_INFO_METRIC,
            "The job's experiment-tracking run (value 1): MLflow run id, experiment id and URL, the tracking "
            "server, and the TensorBoard folder.",
            labels=labels,
        )
        info.add_metric([str(getattr(status, label)) for label in labels], 1)
        yield info
        failing = GaugeMetricFamily(
            TRACKING_FAILING_METRIC,
            "1 while a tracking sink cannot publish (records wait in the journal on the output volume).",
            labels=["sink", "reason"],
        )
        pending = GaugeMetricFamily(
            TRACKING_PENDING_METRIC, "Records in the tracking journal a sink has not published yet.", labels=["sink"]
        )
        published = GaugeMetricFamily(
            "finetune_tracking_published_step", "Last step a tracking sink has published.", labels=["sink"]
        )
        for sink, state in sorted(status.sinks.items()):
            failing.add_metric([sink, state.reason], 1 if state.failing else 0)
            pending.add_metric([sink], state.pending)
            published.add_metric([sink], state.published_step)
        yield failing
        yield pending
        yield published
