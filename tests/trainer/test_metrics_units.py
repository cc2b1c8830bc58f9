"""The progress exporter serves the METRICS.md names on base port + local rank, on the pod IP."""

from __future__ import annotations

import urllib.request

import pytest

from finetune_localcluster.ports import free_port
from finetune_operator.reconcile.progress import parse
from finetune_trainer.metrics import ProgressMetrics, new_registry, serve

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(30)]

NAMES = (
    "finetune_train_global_step",
    "finetune_train_max_steps",
    "finetune_train_epoch",
    "finetune_train_loss",
    "finetune_train_learning_rate",
    "finetune_train_grad_norm",
    "finetune_train_steps_total",
    "finetune_train_samples_total",
    "finetune_train_tokens_total",
    "finetune_train_step_duration_seconds_bucket",
    "finetune_train_dataloader_wait_seconds_bucket",
    "finetune_train_last_step_timestamp_seconds",
    "finetune_checkpoint_last_success_timestamp_seconds",
    "finetune_trainer_info",
    "finetune_train_model_flops_total",
    "finetune_checkpoint_resumed_step",
    "finetune_checkpoint_resume_converted",
)


def test_exporter_serves_progress_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_port()
    monkeypatch.setenv("FTJOB_METRICS_PORT", str(base - 1))
    monkeypatch.setenv("FTJOB_POD_IP", "127.0.0.1")
    registry = new_registry()
    metrics = ProgressMetrics(
        registry, {"rank": "1", "local_rank": "1", "zero_stage": "2", "method": "lora", "UUID": ""}
    )
    metrics.max_steps.set(10)
    metrics.step_done(
        step=3,
        epoch=0.5,
        loss=1.25,
        lr=1e-4,
        grad_norm=0.5,
        samples=8,
        tokens=100,
        seconds=0.2,
        wait_seconds=0.001,
        model_params=1000,
    )
    metrics.checkpoint_done(0.5)
    metrics.resumed(8, converted=True)
    assert serve(registry, local_rank=1) == base
    with urllib.request.urlopen(f"http://127.0.0.1:{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    for name in NAMES:
        assert name in text, name
    assert "finetune_train_global_step 3.0" in text
    assert "finetune_train_tokens_total 100.0" in text
    assert "finetune_train_model_flops_total 600000.0" in text
    read = parse(text) or {}  # what the operator makes of it
    assert (read["step"], read["resumed_step"], read["converted"]) == (3, 8, 1), read
    assert 'finetune_trainer_info{UUID="",local_rank="1",method="lora",rank="1",zero_stage="2"} 1.0' in text


def test_port_off_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTJOB_METRICS_PORT", "off")
    assert serve(new_registry(), 0) is None
