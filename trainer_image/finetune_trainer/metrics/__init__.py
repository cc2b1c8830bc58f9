"""Prometheus metrics of a trainer rank: progress now; memory and communication collectors plug in here."""

from .exporter import new_registry, serve
from .progress import ProgressMetrics

__all__ = ["ProgressMetrics", "new_registry", "serve"]
