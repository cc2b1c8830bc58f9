"""Progress read from rank 0's metrics: parsing, rates and ETA, and quiet degradation."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from finetune_operator.reconcile import runner
from finetune_operator.reconcile.observed import Observed, PodView
from finetune_operator.reconcile.progress import Sample, parse, scrape, to_progress
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.factories import make_job
from tests.support.cluster import FakeCluster, stored_job

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


def test_the_resumed_checkpoint_and_its_conversion_are_read() -> None:
    text = TEXT + "finetune_checkpoint_resumed_step 8.0\nfinetune_checkpoint_resume_converted 1.0\n"
    progress = to_progress(NOW, Sample(at=1.0, values=parse(text) or {}), None)
    assert progress.resumed_from_step == 8 and progress.checkpoint_converted is True
    fresh = TEXT + "finetune_checkpoint_resumed_step 0.0\nfinetune_checkpoint_resume_converted 0.0\n"
    progress = to_progress(NOW, Sample(at=1.0, values=parse(fresh) or {}), None)
    assert progress.resumed_from_step is None and progress.checkpoint_converted is None


def test_before_the_first_step_there_is_no_loss_or_summary() -> None:
    progress = to_progress(NOW, Sample(at=1.0, values={"step": 0.0, "loss": 0.0}), None)
    assert progress.loss is None and progress.summary is None and progress.tokens_per_second is None


def test_garbage_and_unreachable_endpoints_degrade_to_none() -> None:
    assert parse("this is { not prometheus") is None
    assert parse("") is None
    assert scrape("http://127.0.0.1:9/metrics", timeout=0.5) is None


def test_non_finite_metrics_are_unknown_never_an_exception() -> None:
    """Rank 0's image is user-chosen: `finetune_train_global_step NaN` used to raise
    "cannot convert float NaN to integer" on every pass and freeze the job's status."""
    text = (
        "finetune_train_global_step NaN\nfinetune_train_max_steps +Inf\n"
        "finetune_train_epoch -Inf\nfinetune_train_loss 0.5\n"
    )
    assert parse(text) == {"loss": 0.5}
    assert parse("finetune_train_global_step NaN\n") is None
    nan, inf = float("nan"), float("inf")
    current = Sample(at=10.0, values={"step": nan, "total": inf, "epoch": -inf, "tokens": inf, "skipped": nan})
    previous = Sample(at=5.0, values={"step": inf, "tokens": nan})
    progress = to_progress(NOW, current, previous)
    assert progress.step == 0 and progress.total_steps is None and progress.epoch is None
    assert progress.skipped_records is None and progress.eta_seconds is None and progress.percent is None
    later = to_progress(NOW, Sample(at=20.0, values={"step": 30.0, "total": 60.0, "loss": nan}), previous)
    assert later.percent == 50 and later.loss is None


def test_a_failing_rank_0_endpoint_is_read_once_per_period_not_on_every_pass(monkeypatch: Any) -> None:
    """An unreachable metrics endpoint (on a real cluster: a 1 s timeout) must not be paid for
    on every pass of a job whose pods keep the work queue busy."""
    hits: list[str] = []

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_error(503)

        def log_message(self, *_args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cluster = FakeCluster(stored_job())
        reconciler = Reconciler(cluster, RenderOptions(metrics_port=server.server_port), lambda *_: None)
        job = make_job().model_copy(update={"metadata": make_job().metadata.model_copy(update={"uid": "u1"})})
        rank0 = PodView(name="j-0", uid="p", ordinal=0, phase="Running", ready=True, ip="127.0.0.1",
                        restart_count=0, deleting=False, config_hash=None, created="", unschedulable=None,
                        terminated=None, last_terminated=None)  # fmt: skip
        observed = Observed(workers=None, pods=(rank0,))
        for _ in range(5):
            assert reconciler._progress(job, observed, NOW) == (None, None)
        assert len(hits) == 1
        monkeypatch.setattr(runner, "PROGRESS_EVERY_SECONDS", 0.0)
        reconciler._progress(job, observed, NOW)
        assert len(hits) == 2
        assert cluster.reads == 0 and cluster.applied == [], "reading progress asks nothing of the apiserver"
    finally:
        server.shutdown()
        server.server_close()
