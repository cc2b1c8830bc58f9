"""Prometheus metrics of a trainer rank: progress, memory (model state, plan, GPU allocator), communication."""

from finetune_trainer.metrics.comm import CommMetrics
from finetune_trainer.metrics.exporter import metrics_enabled, new_registry, serve
from finetune_trainer.metrics.memory import MemoryMetrics
from finetune_trainer.metrics.progress import ProgressMetrics
from finetune_trainer.metrics.rank import RankMetrics

__all__ = ["CommMetrics", "MemoryMetrics", "ProgressMetrics", "RankMetrics", "metrics_enabled", "new_registry", "serve"]
