"""The hub model's download, once per pod, before the ranks start.

Without it every rank (8 per pod) asks the hub for the same files and, worse, a gang restart
downloads 16 GB (8B) or 141 GB (70B) again into the container layer. The operator renders
FTJOB_PREFETCH_MODEL=1 with HF_HOME on the pod's model cache volume (a sized emptyDir or a
claim), and `ftjob train` calls `prefetch` before launching DeepSpeed: the ranks then load
from the cache. Models on `pvc://` need none of this and are the recommended path.
"""

from __future__ import annotations

import logging
import os

from .settings import JobConfig

log = logging.getLogger(__name__)
ENV = "FTJOB_PREFETCH_MODEL"
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py"]
"""What from_pretrained reads: configs, safetensors weights, tokenizer files (no .bin/.pth duplicates)."""


def hub_repo(uri: str) -> str | None:
    """The repo id of a hub URI (`org/name`, `hf://org/name`), None for anything else."""
    if uri.startswith(("pvc://", "file://", "/", "builtin://")):
        return None
    return uri.removeprefix("hf://")


def prefetch(cfg: JobConfig) -> str | None:
    """Download the job's hub model into HF_HOME when the pod asks for it; returns the local folder."""
    model = cfg.job.spec.model
    repo = hub_repo(model.uri)
    if os.environ.get(ENV) != "1" or repo is None:
        return None
    from huggingface_hub import snapshot_download

    log.warning("downloading %s into the model cache %s (once per pod)", repo, os.environ.get("HF_HOME", ""))
    path = str(snapshot_download(repo, revision=model.revision, allow_patterns=WEIGHT_PATTERNS))
    tokenizer = hub_repo(model.tokenizer) if model.tokenizer else None
    if tokenizer is not None:
        snapshot_download(tokenizer, allow_patterns=WEIGHT_PATTERNS)
    return path
