"""The hub model's download, once per pod, before the ranks start.

Without it every rank (8 per pod) asks the hub for the same files and, worse, a gang restart
downloads 16 GB (8B) or 141 GB (70B) again into the container layer. The operator renders
FTJOB_PREFETCH_MODEL=1 with HF_HOME on the pod's model cache volume (a sized emptyDir or a
claim), and `ftjob train` calls `prefetch` before launching DeepSpeed: the ranks then load
from the cache. Models on `pvc://` need none of this and are the recommended path.

While it downloads, the entrypoint serves two gauges on rank 0's metrics port (which no rank
holds yet): `finetune_model_download_bytes` (what the cache holds of the repo) and
`finetune_model_download_total_bytes` (the files to fetch). The operator reads them like the
training progress, so `kubectl get ftj` shows the download instead of a silent pod.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from finetune_operator.api.model_cache import DOWNLOADED_PATTERNS
from finetune_operator.api.model_uri import hub_model
from finetune_operator.api.pod_env import PodEnv
from finetune_trainer.metrics.exporter import metrics_port
from finetune_trainer.settings import JobConfig

log = logging.getLogger(__name__)
WEIGHT_PATTERNS = list(DOWNLOADED_PATTERNS)
"""What from_pretrained reads: configs, safetensors weights, tokenizer files, the chat template."""


def hub_repo(uri: str) -> str | None:
    """The repo id of a hub URI (`org/name`, `hf://org/name`, either with `@revision`), None for anything else."""
    model = hub_model(uri)
    return model.repo if model is not None else None


DOWNLOADED = "finetune_model_download_bytes"
TOTAL = "finetune_model_download_total_bytes"
POLL_SECONDS = 1.0


def _hub_total_bytes(repo: str, revision: str | None) -> int:
    """Bytes of the files `prefetch` will fetch (from the hub's file listing)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    siblings = info.siblings or []
    return sum(int(f.size or 0) for f in siblings if any(fnmatch(f.rfilename, p) for p in WEIGHT_PATTERNS))


def cache_bytes(root: Path) -> int:
    """What the cache folder holds now, partial downloads included."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                try:
                    total += path.stat().st_size
                except OSError:
                    continue
    return total


def download_gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """The download's two gauges (bytes held, bytes to fetch); the docs' metrics page lists them too."""
    done = Gauge(DOWNLOADED, "Bytes of the model the pod's cache holds while it downloads.", registry=registry)
    total = Gauge(TOTAL, "Bytes of the model files to download.", registry=registry)
    return done, total


@contextmanager
def download_progress(total: int, folder: Path, *, port: int | None, address: str) -> Iterator[None]:
    """Serve the download gauges on `address:port` while the block runs (nothing if port is None
    or taken: a download never fails for its metrics)."""
    if port is None:
        yield
        return
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    done, planned = download_gauges(registry)
    planned.set(total)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            done.set(cache_bytes(folder))
            stop.wait(POLL_SECONDS)

    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        log.warning("download progress not served on %s:%d: %s", address, port, exc)
        yield
        return
    watcher = threading.Thread(target=watch, name="download-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=5)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


Downloader = Callable[..., str]


def repo_cache_folder(repo: str) -> Path:
    """Where the hub library keeps `repo` (HF_HUB_CACHE, else HF_HOME/hub)."""
    home = Path(os.environ.get(PodEnv.HF_HOME, str(Path.home() / ".cache" / "huggingface")))
    hub = Path(os.environ.get("HF_HUB_CACHE", str(home / "hub")))
    return hub / ("models--" + repo.replace("/", "--"))


def prefetch(
    cfg: JobConfig, node_rank: int = 0, *, downloader: Downloader | None = None, total: int | None = None
) -> str | None:
    """Download the job's hub model into HF_HOME when the pod asks for it; returns the local folder.

    `downloader` and `total` stand in for the hub in tests (`snapshot_download` and the size
    of the repo's files)."""
    model = cfg.job.spec.model
    hub = hub_model(model.uri, model.revision)
    if os.environ.get(PodEnv.FTJOB_PREFETCH_MODEL) != "1" or hub is None:
        return None
    repo, revision = hub.repo, hub.revision
    if downloader is None:
        from huggingface_hub import snapshot_download

        downloader = snapshot_download
    cache = repo_cache_folder(repo)
    log.warning("downloading %s into the model cache %s (once per pod)", repo, cache)
    if total is None:
        try:
            total = _hub_total_bytes(repo, revision)
        except Exception as exc:  # the listing is only for the progress: the download says what is wrong
            log.warning("cannot size %s for the download progress: %s", repo, exc)
            total = 0
    port = metrics_port(0) if node_rank == 0 else None  # rank 0's port: the one the operator reads
    address = os.environ.get(PodEnv.FTJOB_POD_IP, "127.0.0.1")
    with download_progress(total, cache, port=port, address=address):
        path = str(downloader(repo, revision=revision, allow_patterns=WEIGHT_PATTERNS))
        tokenizer = hub_repo(model.tokenizer) if model.tokenizer else None
        if tokenizer is not None:
            downloader(tokenizer, allow_patterns=WEIGHT_PATTERNS)
    return path
