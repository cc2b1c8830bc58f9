"""The one place a rank learns which device its tensors belong on.

NCCL has no host tensors: a collective handed a CPU tensor fails with "No backend type
associated with device type cpu". Gloo accepts them, so the CPU tests never saw it. Every
tensor the trainer builds for a collective is therefore created with `rank_device()`, the
device DeepSpeed's accelerator names for this rank (`cuda:N` after `set_device`, `cpu`
under DS_ACCELERATOR=cpu), which is also `engine.device`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from finetune_operator.api.pod_env import PodEnv


def rank_device() -> Any:
    """This rank's `torch.device`, as DeepSpeed's accelerator sees it."""
    import torch
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


def float64_on_rank(values: list[float]) -> Any:
    """`values` as a float64 tensor on this rank's device, ready for a collective."""
    import torch

    return torch.tensor(values, dtype=torch.float64, device=rank_device())


DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")


def driver_description() -> str:
    """The NVIDIA kernel driver this container sees, in words (its version line, or its absence)."""
    version_file = DRIVER_VERSION_FILE
    try:
        first = version_file.read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return f"no NVIDIA driver visible ({version_file} missing: is the NVIDIA container runtime in use?)"
    return f"driver: {first}"


def expects_gpu(gpus_per_node: int) -> bool:
    """Whether this rank was planned onto GPUs (the job asks for them, or the pod says cuda)."""
    return gpus_per_node > 0 or os.environ.get(PodEnv.DS_ACCELERATOR, "") == "cuda"


def process_group_backend(gpus_per_node: int) -> str:
    """nccl on GPU, gloo on CPU; a rank planned for GPUs that finds none is a ConfigError, never gloo.

    The usual cause is a torch built for a newer CUDA than the node's driver runs (a CUDA 13
    wheel on an R535-R570 driver): `torch.cuda.is_available()` is then False, and falling back
    to gloo while DeepSpeed keeps its cuda accelerator fails later with a confusing error.
    """
    import torch

    if torch.cuda.is_available():
        return "nccl"
    if not expects_gpu(gpus_per_node):
        return "gloo"
    from finetune_trainer.settings import ConfigError

    raise ConfigError(
        f"resources.gpusPerNode={gpus_per_node} but torch sees no CUDA device: torch {torch.__version__} "
        f"is built for CUDA {torch.version.cuda or 'none (a CPU build)'}, {driver_description()}. "
        "A CUDA 12.x build of torch runs on R535 and newer drivers; rebuild the trainer image with it "
        "(trainer_image/Dockerfile TORCH_INDEX_URL) or update the node's driver"
    )
