"""`ftjob operator`'s options as one typed, frozen value (issue 44): what the operator builds from
its flags and environment, and what kopf is told, are what `run` built before, pinned from it."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import kopf
import pytest

from finetune_operator.cli import operator_cmd
from finetune_operator.cli.operator_settings import OperatorSettings
from finetune_operator.handlers.registry import NoDiffBase, kopf_settings

ENV = {
    "FTJOB_WATCH_NAMESPACES": "a, b",
    "FTJOB_S3_DEFAULT_CA_BUNDLE": "ca/bundle.pem",
    "HF_ENDPOINT": "https://mirror.example/",
    "HF_HUB_OFFLINE": "1",
}
FLAGS = [
    "--kueue", "--default-queue-name", "q", "--interval", "2.5", "--workers", "3", "--s3-endpoint", "https://s3.x",
    "--s3-path-style", "--allowed-priority-class", "hi", "--allowed-toleration-key", "gpu", "--allow-tolerate-all",
    "--gpu-placement", "product", "--pod-monitor", "--metrics-address", "127.0.0.1", "--health-port", "9001",
    "--verbose", "--kubeconfig", "/k",
]  # fmt: skip
RENDER = (
    "RenderOptions(trainer_image='ghcr.io/finetune-operator/trainer:0.1.0', image_pull_policy='IfNotPresent', "
    "master_port=29500, metrics_port=9400, pod_monitor={monitor}, run_as_user=1000, termination_grace_seconds=60, "
    "default_queue_name={queue}, default_tracking_uri=None, object_storage=ObjectStorageSpec(endpoint={endpoint}, "
    "region=None, path_style={path_style}, ca_bundle=ConfigMapKey(name='ca', key='bundle.pem'), credentials=None, "
    "service_account_name=None, retry_timeout_seconds=None), hub_endpoint='https://mirror.example/', "
    "model_cache_storage_class=None, download_timeout_seconds=7200, gpu_placement={placement})"
)
MEMORY, PRODUCT = "<GpuPlacement.MEMORY: 'memory'>", "<GpuPlacement.PRODUCT: 'product'>"
# what the original `run` built from the same environment and flags
PINNED = {
    "defaults": (
        [],
        RENDER.format(monitor=False, queue=None, endpoint=None, path_style=None, placement=MEMORY),
        "SchedulingPolicy(priority_classes=(), toleration_keys=(), tolerate_everything=False, token_volumes=False)",
        "HandlerSettings(interval_seconds=5.0, resync_seconds=300.0, max_workers=16, kueue=False)",
        {"clusterwide": False, "namespaces": ["a", "b"], "liveness_endpoint": "http://0.0.0.0:8081/healthz"},
        (8080, "0.0.0.0", 18, None, False),
    ),
    "flags": (
        FLAGS,
        RENDER.format(monitor=True, queue="'q'", endpoint="'https://s3.x'", path_style=True, placement=PRODUCT),
        "SchedulingPolicy(priority_classes=('hi',), toleration_keys=('gpu',), tolerate_everything=True, "
        "token_volumes=False)",
        "HandlerSettings(interval_seconds=2.5, resync_seconds=300.0, max_workers=3, kueue=True)",
        {"clusterwide": False, "namespaces": ["a", "b"], "liveness_endpoint": "http://127.0.0.1:9001/healthz"},
        (8080, "127.0.0.1", 5, "/k", True),
    ),
}


@pytest.mark.parametrize("case", list(PINNED))
def test_the_settings_are_what_run_built_from_the_flags(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", "FTJOB_HUB_OFFLINE", "FTJOB_TRAINER_IMAGE", "FTJOB_METRICS_ADDRESS", "FTJOB_KUEUE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    argv, render, policy, handlers, kopf_args, process = PINNED[case]
    parser = argparse.ArgumentParser()
    operator_cmd.configure(parser)
    settings = OperatorSettings.from_args(parser.parse_args(argv))
    assert repr(settings.render) == render
    assert repr(settings.hub) == "HubSettings(endpoint='https://mirror.example', offline=True)"
    assert (repr(settings.policy), repr(settings.handlers)) == (policy, handlers)
    assert settings.kopf_operator_args() == kopf_args
    assert (settings.metrics_port, settings.metrics_address, settings.connections) == process[:3]
    assert (settings.kubeconfig, settings.verbose) == process[3:]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.verbose = False  # type: ignore[misc]


def test_kopf_is_told_what_the_startup_handler_told_it() -> None:
    settings = kopf.OperatorSettings()
    kopf_settings(settings)
    assert isinstance(settings.persistence.diffbase_storage, NoDiffBase)
    assert settings.posting.level == logging.CRITICAL
    assert settings.scanning.disabled is True
    assert (settings.watching.server_timeout, settings.networking.request_timeout) == (270, 30)
