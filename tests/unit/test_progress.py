"""Progress read from rank 0's metrics: parsing, rates and ETA, and quiet degradation."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from finetune_operator.reconcile import runner
from finetune_operator.reconcile.cluster_io import ClusterIO
from finetune_operator.reconcile.observed import Observed, PodView
from finetune_operator.reconcile.progress import Sample, parse, scrape, to_progress
from finetune_operator.reconcile.runner import Reconciler
from finetune_operator.render.options import RenderOptions
from tests.factories import make_job

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
        reconciler = Reconciler(cast(ClusterIO, None), RenderOptions(metrics_port=server.server_port), lambda *_: None)
        job = make_job().model_copy(update={"metadata": make_job().metadata.model_copy(update={"uid": "u1"})})
        rank0 = PodView(name="j-0", uid="p", ordinal=0, phase="Running", ready=True, ip="127.0.0.1",
                        restart_count=0, deleting=False, config_hash=None, created="", unschedulable=None,
                        terminated=None, last_terminated=None)  # fmt: skip
        observed = Observed(workers=None, pods=(rank0,))
        for _ in range(5):
            assert reconciler._progress(job, observed, NOW) is None
        assert len(hits) == 1
        monkeypatch.setattr(runner, "PROGRESS_EVERY_SECONDS", 0.0)
        reconciler._progress(job, observed, NOW)
        assert len(hits) == 2
    finally:
        server.shutdown()
        server.server_close()
