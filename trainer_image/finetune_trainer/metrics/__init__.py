"""Prometheus metrics of a trainer rank: progress, memory (model state, plan, GPU allocator), communication."""

from .comm import CommMetrics
from .exporter import metrics_enabled, new_registry, serve
from .memory import MemoryMetrics
from .progress import ProgressMetrics
from .rank import RankMetrics

__all__ = ["CommMetrics", "MemoryMetrics", "ProgressMetrics", "RankMetrics", "metrics_enabled", "new_registry", "serve"]
