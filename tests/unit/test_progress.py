"""Progress read from rank 0's metrics: parsing, rates and ETA, and quiet degradation."""

from __future__ import annotations

from datetime import UTC, datetime

from finetune_operator.reconcile.progress import Sample, parse, scrape, to_progress

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TEXT = """# HELP finetune_train_global_step Optimizer steps taken.
# TYPE finetune_train_global_step gauge
finetune_train_global_step 120.0
finetune_train_max_steps 500.0
finetune_train_epoch 0.48
finetune_train_loss 1.23456
# TYPE finetune_train_tokens counter
finetune_train_tokens_total 240000.0
"""


def test_parse_reads_the_progress_gauges() -> None:
    assert parse(TEXT) == {"step": 120.0, "total": 500.0, "epoch": 0.48, "loss": 1.23456, "tokens": 240000.0}


def test_rates_and_eta_come_from_two_scrapes() -> None:
    earlier = Sample(at=100.0, values={"step": 100.0, "total": 500.0, "tokens": 200000.0})
    now = Sample(at=110.0, values={"step": 120.0, "total": 500.0, "tokens": 240000.0, "loss": 1.23456})
    progress = to_progress(NOW, now, earlier)
    assert progress.tokens_per_second == 4000.0
    assert progress.eta_seconds == 190  # 380 steps at 2 steps/s
    assert progress.percent == 24 and progress.summary == "120/500 (24%)"
    assert progress.loss == 1.2346


def test_before_the_first_step_there_is_no_loss_or_summary() -> None:
    progress = to_progress(NOW, Sample(at=1.0, values={"step": 0.0, "loss": 0.0}), None)
    assert progress.loss is None and progress.summary is None and progress.tokens_per_second is None


def test_garbage_and_unreachable_endpoints_degrade_to_none() -> None:
    assert parse("this is { not prometheus") is None
    assert parse("") is None
    assert scrape("http://127.0.0.1:9/metrics", timeout=0.5) is None
