"""A rank's process-group backend and device (issue 13, defect 2).

A rank planned onto GPUs that finds no CUDA device must fail with a ConfigError naming
torch's CUDA build and the driver, never fall back to gloo (the CUDA 13 wheel on an
R535-R570 driver case). torch.cuda availability is monkeypatched: no GPU here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_trainer.rank import devices
from finetune_trainer.settings import ConfigError


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)


@pytest.mark.usefixtures("no_cuda")
def test_planned_gpus_without_cuda_is_a_config_error_naming_build_and_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")
    monkeypatch.setattr(devices, "DRIVER_VERSION_FILE", version)
    with pytest.raises(ConfigError) as err:
        devices.process_group_backend(8)
    message = str(err.value)
    assert "resources.gpusPerNode=8" in message
    assert "CUDA 13.0" in message and "535.183.01" in message and "12.x" in message


@pytest.mark.usefixtures("no_cuda")
def test_missing_driver_is_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(devices, "DRIVER_VERSION_FILE", tmp_path / "absent")
    with pytest.raises(ConfigError, match="no NVIDIA driver visible"):
        devices.process_group_backend(1)


@pytest.mark.usefixtures("no_cuda")
def test_pod_rendered_for_cuda_counts_as_expecting_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ConfigError):
        devices.process_group_backend(0)


@pytest.mark.usefixtures("no_cuda")
def test_cpu_job_uses_gloo() -> None:
    assert devices.process_group_backend(0) == "gloo"


def test_gpu_visible_uses_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.process_group_backend(8) == "nccl"
