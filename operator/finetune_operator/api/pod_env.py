"""Every environment variable of a trainer pod's contract, declared once for both sides.

The renderers write these names into the trainer container, the launchers add theirs for each
rank, and the trainer reads them back; all three spell a name only as a `PodEnv` member, so a
renamed variable fails `mypy --strict` or a unit test instead of a cluster run. Each name is in
one of three groups:

- `RESERVED`: set by the operator or a launcher, and a user's `spec.env` may not name it
  (the CRD refuses it; see `spec.RESERVED_ENV`);
- `OVERRIDABLE`: defaults the operator sets that a user's own entry replaces;
- `LOCAL_OVERRIDES`: never set in a pod; they redirect a fixed path for `ftjob run` and tests.

`OPERATOR_SET` is what the renderers may emit and `LAUNCHER_SET` what a launcher sets per rank.
The trainer's own tuning knobs (timeouts, fault injection, ...) are not part of the contract:
the operator never sets them, and they stay with the trainer modules that read them.
"""

from __future__ import annotations

from enum import StrEnum


class PodEnv(StrEnum):
    """The name of a trainer pod's environment variable (a `str`: pass it to `os.environ`)."""

    MASTER_ADDR = "MASTER_ADDR"
    """Rank 0's pod DNS name: the rendezvous host."""
    MASTER_PORT = "MASTER_PORT"
    """The rendezvous port on rank 0's pod."""
    RANK = "RANK"
    """The global rank of a worker process (set by the node launcher, DeepSpeed's contract)."""
    LOCAL_RANK = "LOCAL_RANK"
    """The rank of a worker process within its pod (set by the node launcher, DeepSpeed's contract)."""
    WORLD_SIZE = "WORLD_SIZE"
    """The number of ranks in the job (set by the node launcher, DeepSpeed's contract)."""
    LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
    """The number of ranks in one pod as torchrun names it: reserved, the node launcher sets LOCAL_SIZE."""
    NODE_RANK = "NODE_RANK"
    """The pod's index in the StatefulSet (its pod-index label; empty before Kubernetes 1.28)."""
    NNODES = "NNODES"
    """The number of pods in the gang (`resources.numNodes`)."""
    CROSS_RANK = "CROSS_RANK"
    """The node rank as the node launcher exports it (DeepSpeed's contract)."""
    CROSS_SIZE = "CROSS_SIZE"
    """The number of nodes as the node launcher exports it (DeepSpeed's contract)."""
    LOCAL_SIZE = "LOCAL_SIZE"
    """The number of ranks in one pod, as the node launcher exports it (DeepSpeed's contract)."""
    CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
    """The GPUs a rank sees (the device plugin and the launcher set it)."""
    DS_ACCELERATOR = "DS_ACCELERATOR"
    """DeepSpeed's accelerator: `cuda` with GPUs, else `cpu`."""
    FTJOB_CONFIG_DIR = "FTJOB_CONFIG_DIR"
    """The mounted config directory (`pod_contract.CONFIG_DIR`)."""
    FTJOB_OUTPUT_DIR = "FTJOB_OUTPUT_DIR"
    """The job's local output folder (the scratch staging folder when the output is on s3://)."""
    FTJOB_POD_NAME = "FTJOB_POD_NAME"
    """The pod's name (its ordinal is the node rank when NODE_RANK is empty)."""
    FTJOB_NAMESPACE = "FTJOB_NAMESPACE"
    """The pod's namespace."""
    FTJOB_POD_IP = "FTJOB_POD_IP"
    """The pod's IP: the address its metrics and peer servers bind to."""
    FTJOB_METRICS_PORT = "FTJOB_METRICS_PORT"
    """The first rank's metrics port; local rank N listens on this port + N."""
    FTJOB_PREFETCH_MODEL = "FTJOB_PREFETCH_MODEL"
    """`1` when the pod downloads a hub model into its cache before any rank starts."""
    FTJOB_JOB_UID = "FTJOB_JOB_UID"
    """The FineTuneJob's uid: the key of its one MLflow run."""
    FTJOB_IMAGE = "FTJOB_IMAGE"
    """The trainer image, recorded in the MLflow run's tags."""
    FTJOB_RUN_STATE_DIR = "FTJOB_RUN_STATE_DIR"
    """The folder the ranks of one launch share with their launcher (set by `ftjob train`)."""
    FTJOB_PROGRESS = "FTJOB_PROGRESS"
    """`1` when rank 0 prints a progress line per step (set by `ftjob train --progress`)."""
    HOME = "HOME"
    """A writable home for libraries that cache there (the image's user has none)."""
    HF_HOME = "HF_HOME"
    """The Hugging Face cache root (inside the model cache volume for a hub model)."""
    HF_ENDPOINT = "HF_ENDPOINT"
    """A Hugging Face hub mirror, from the operator's settings."""
    HF_TOKEN = "HF_TOKEN"
    """The hub token, from `spec.hfTokenSecretRef`."""
    PYTORCH_CUDA_ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
    """The CUDA caching allocator's settings (expandable segments against fragmentation)."""
    PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
    """Unbuffered output, so the pod's log keeps up with the ranks."""
    OMP_NUM_THREADS = "OMP_NUM_THREADS"
    """Torch's CPU threads per rank: the pod's CPUs shared by its ranks (rendered from `resources.cpu`;
    without it the node launcher divides the CPUs the pod may run on among its ranks)."""
    MKL_NUM_THREADS = "MKL_NUM_THREADS"
    """MKL's CPU threads per rank, the same share as OMP_NUM_THREADS."""
    HF_HUB_OFFLINE = "HF_HUB_OFFLINE"
    """`1` for the ranks once the pod prefetched the hub model: they load it from the cache, and no
    rank asks the hub again (set by `ftjob train`; a user's own value wins)."""
    NCCL_DEBUG = "NCCL_DEBUG"
    """NCCL's log level on GPU pods (`WARN`: a failed collective says why in the pod's log)."""
    TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    """What torch's NCCL watchdog does with a collective past its timeout (`1`: abort the
    communicators and end the rank, which the launcher reports as an abort, not a silent kill)."""
    TORCH_NCCL_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
    """`1`: a timed-out collective dumps the flight recorder (which collective each rank was in)."""
    TORCH_NCCL_TRACE_BUFFER_SIZE = "TORCH_NCCL_TRACE_BUFFER_SIZE"
    """The flight recorder's entries per rank (0 turns it, and the dump on timeout, off)."""
    FTJOB_DOWNLOAD_TIMEOUT_SECONDS = "FTJOB_DOWNLOAD_TIMEOUT_SECONDS"
    """How long a pod's model download (and its wait for the other pods') may take."""
    FTJOB_STOP_GRACE_SECONDS = "FTJOB_STOP_GRACE_SECONDS"
    """How long the entrypoint and the launcher give the ranks to stop on SIGTERM (finish the step,
    save a checkpoint) before SIGKILL: the pod's grace period less a reserve (`render/stop_grace.py`)."""
    MLFLOW_TRACKING_TOKEN = "MLFLOW_TRACKING_TOKEN"
    """MLflow's bearer token, from the tracking Secret."""
    MLFLOW_TRACKING_USERNAME = "MLFLOW_TRACKING_USERNAME"
    """MLflow's basic-auth user, from the tracking Secret."""
    MLFLOW_TRACKING_PASSWORD = "MLFLOW_TRACKING_PASSWORD"
    """MLflow's basic-auth password, from the tracking Secret."""
    FTJOB_S3_ENDPOINT = "FTJOB_S3_ENDPOINT"
    """The object store's endpoint URL."""
    FTJOB_S3_REGION = "FTJOB_S3_REGION"
    """The object store's region."""
    FTJOB_S3_PATH_STYLE = "FTJOB_S3_PATH_STYLE"
    """`true` for path-style bucket addressing, `false` for virtual-host style."""
    FTJOB_S3_RETRY_SECONDS = "FTJOB_S3_RETRY_SECONDS"
    """How long the trainer retries a failing object store request."""
    FTJOB_S3_MIRROR = "FTJOB_S3_MIRROR"
    """Where s3:// inputs are downloaded in the pod (inside the model cache)."""
    FTJOB_S3_CREDENTIALS_SECRET = "FTJOB_S3_CREDENTIALS_SECRET"
    """The name of the credentials Secret, so the trainer can say whose keys were refused."""
    AWS_CA_BUNDLE = "AWS_CA_BUNDLE"
    """The object store's CA bundle, mounted from a ConfigMap."""
    AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
    """The object store's access key id, from the credentials Secret."""
    AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
    """The object store's secret access key, from the credentials Secret."""
    FTJOB_TERMINATION_LOG = "FTJOB_TERMINATION_LOG"
    """Where the trainer writes its termination message instead of `pod_contract.TERMINATION_LOG`."""
    FTJOB_PVC_ROOT = "FTJOB_PVC_ROOT"
    """Where `pvc://` claims are mounted instead of the pod's fixed mount root."""


RESERVED: tuple[PodEnv, ...] = (
    PodEnv.MASTER_ADDR,
    PodEnv.MASTER_PORT,
    PodEnv.RANK,
    PodEnv.LOCAL_RANK,
    PodEnv.WORLD_SIZE,
    PodEnv.LOCAL_WORLD_SIZE,
    PodEnv.NODE_RANK,
    PodEnv.NNODES,
    PodEnv.CROSS_RANK,
    PodEnv.CROSS_SIZE,
    PodEnv.CUDA_VISIBLE_DEVICES,
    PodEnv.FTJOB_CONFIG_DIR,
    PodEnv.FTJOB_OUTPUT_DIR,
    PodEnv.FTJOB_POD_NAME,
    PodEnv.FTJOB_NAMESPACE,
    PodEnv.FTJOB_POD_IP,
    PodEnv.FTJOB_METRICS_PORT,
    PodEnv.FTJOB_PREFETCH_MODEL,
    PodEnv.FTJOB_JOB_UID,
    PodEnv.FTJOB_IMAGE,
    PodEnv.DS_ACCELERATOR,
)
"""Names a user may not set: a user value would silently break the rendezvous, or duplicate a
key the apiserver then refuses in the StatefulSet (the job left without status). In the order
the CRD's validation message lists them."""

OVERRIDABLE: frozenset[PodEnv] = frozenset(
    {
        PodEnv.HOME,
        PodEnv.HF_HOME,
        PodEnv.HF_ENDPOINT,
        PodEnv.HF_TOKEN,
        PodEnv.PYTORCH_CUDA_ALLOC_CONF,
        PodEnv.PYTHONUNBUFFERED,
        PodEnv.OMP_NUM_THREADS,
        PodEnv.MKL_NUM_THREADS,
        PodEnv.NCCL_DEBUG,
        PodEnv.TORCH_NCCL_ASYNC_ERROR_HANDLING,
        PodEnv.TORCH_NCCL_DUMP_ON_TIMEOUT,
        PodEnv.TORCH_NCCL_TRACE_BUFFER_SIZE,
        PodEnv.FTJOB_DOWNLOAD_TIMEOUT_SECONDS,
        PodEnv.FTJOB_STOP_GRACE_SECONDS,
        PodEnv.MLFLOW_TRACKING_TOKEN,
        PodEnv.MLFLOW_TRACKING_USERNAME,
        PodEnv.MLFLOW_TRACKING_PASSWORD,
        PodEnv.FTJOB_S3_ENDPOINT,
        PodEnv.FTJOB_S3_REGION,
        PodEnv.FTJOB_S3_PATH_STYLE,
        PodEnv.FTJOB_S3_RETRY_SECONDS,
        PodEnv.FTJOB_S3_MIRROR,
        PodEnv.FTJOB_S3_CREDENTIALS_SECRET,
        PodEnv.AWS_CA_BUNDLE,
        PodEnv.AWS_ACCESS_KEY_ID,
        PodEnv.AWS_SECRET_ACCESS_KEY,
    }
)
"""Defaults the operator sets unless the user's `spec.env` names them (then the user's entry wins)."""

LAUNCHER_SET: frozenset[PodEnv] = frozenset(
    {
        PodEnv.RANK,
        PodEnv.LOCAL_RANK,
        PodEnv.WORLD_SIZE,
        PodEnv.LOCAL_WORLD_SIZE,
        PodEnv.CROSS_RANK,
        PodEnv.CROSS_SIZE,
        PodEnv.LOCAL_SIZE,
        PodEnv.CUDA_VISIBLE_DEVICES,
        PodEnv.FTJOB_RUN_STATE_DIR,
        PodEnv.FTJOB_PROGRESS,
        PodEnv.HF_HUB_OFFLINE,
    }
)
"""Set for each rank by the node launcher or `ftjob train`, never rendered by the operator.
LOCAL_SIZE, FTJOB_RUN_STATE_DIR and FTJOB_PROGRESS are not reserved: the launcher overwrites a
user's value. HF_HUB_OFFLINE is not reserved either: a user's own value is kept."""

LOCAL_OVERRIDES: frozenset[PodEnv] = frozenset({PodEnv.FTJOB_TERMINATION_LOG, PodEnv.FTJOB_PVC_ROOT})
"""Never set in a pod: they move a fixed pod path elsewhere for `ftjob run` and the tests."""

OPERATOR_SET: frozenset[PodEnv] = frozenset(PodEnv) - LAUNCHER_SET - LOCAL_OVERRIDES
"""Every name the operator's renderers may write into a trainer container."""

CUDA_ALLOCATOR_DEFAULT = "expandable_segments:True"
"""PYTORCH_CUDA_ALLOC_CONF unless a user sets it: the pod's default, and each rank's under `ftjob run`
(fragmentation is a classic "OOM with free memory")."""
