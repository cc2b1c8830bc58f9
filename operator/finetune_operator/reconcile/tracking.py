"""What rank 0 says about the job's experiment tracking, read from the same scrape as its progress.

The trainer names its MLflow run in an info series (`finetune_tracking_info`) and says, per
sink, whether publishing fails and how many records wait (`finetune_tracking_failing`,
`finetune_tracking_pending_records`; names in `api.tracking`). Nothing here talks to the
tracking server: the operator only copies what rank 0 reports into `status.result.tracking`.
A scrape without these series (tracking off, an older trainer) reports nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from ..api.tracking import TRACKING_FAILING_METRIC, TRACKING_INFO_METRIC, TRACKING_PENDING_METRIC, TrackingResult

MLFLOW_SINK = "mlflow"


@dataclass(frozen=True)
class TrackingReport:
    """One scrape's view of the job's tracking (the MLflow sink's health)."""

    result: TrackingResult
    tracking_uri: str | None
    pending: int


def parse_report(text: str) -> TrackingReport | None:
    labels: dict[str, str] = {}
    failing: tuple[bool, str] | None = None
    pending = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == TRACKING_INFO_METRIC:
                    labels = dict(sample.labels)
                elif sample.labels.get("sink") != MLFLOW_SINK or not math.isfinite(sample.value):
                    continue
                elif sample.name == TRACKING_FAILING_METRIC:
                    failing = (sample.value > 0, sample.labels.get("reason", ""))
                elif sample.name == TRACKING_PENDING_METRIC:
                    pending = max(0, int(sample.value))
    except (ValueError, TypeError):
        return None
    if not labels and failing is None:
        return None
    result = TrackingResult(
        run_id=labels.get("run_id", "")[:128] or None,
        experiment_id=labels.get("experiment_id", "")[:128] or None,
        run_url=labels.get("run_url", "")[:1024] or None,
        tensorboard_log_dir=labels.get("tensorboard_dir", "")[:1024] or None,
        failing=failing[0] if failing is not None else None,
        reason=(failing[1][:256] or None) if failing is not None and failing[0] else None,
    )
    return TrackingReport(result, labels.get("tracking_uri") or None, pending)
