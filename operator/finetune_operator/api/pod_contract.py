"""The contract between the operator and its trainer pods, typed once for both sides.

The operator writes a config directory into every pod and reads back what a finished
container left in its termination message; the trainer does the opposite. Both sides
import the names and models from here, so a renamed file, reason or field fails
`mypy --strict` or a unit test instead of a cluster run:

- the config files a pod receives (`CONFIG_DIR`, `JOB_FILE`, ...);
- the one-line root cause of a failed run (`TerminationReason`), whether the operator
  retries it (`TerminationReason.retried`), and the one out-of-memory pattern both sides recognise;
- the JSON summary of a successful run (`TrainingSummary`), which becomes `status.result`;
- the checkpoint state the trainer resumes from (`CheckpointState`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError

from . import reasons
from .base import ApiModel
from .status import Result
from .strategy import Strategy
from .tracking import TrackingResult

CONFIG_DIR = "/etc/ftjob"
JOB_FILE = "job.json"
PLAN_FILE = "plan.json"
DEEPSPEED_FILE = "deepspeed.json"
HOSTFILE = "hostfile"
TERMINATION_LOG = "/dev/termination-log"
"""Where a trainer container writes its termination message (the pod's `terminationMessagePath`)."""


class TerminationReason(StrEnum):
    """The first word of a failed trainer's termination message: `<Reason>: <message>`."""

    OUT_OF_MEMORY = reasons.OUT_OF_MEMORY
    DATA_ERROR = "DataError"
    DATA_UNAVAILABLE = "DataUnavailable"
    MODEL_NOT_FOUND = reasons.MODEL_NOT_FOUND
    CONFIG_ERROR = "ConfigError"
    TRAINING_ERROR = "TrainingError"
    TERMINATED = "Terminated"
    RANK_KILLED = "RankKilled"
    RANK_ABORTED = "RankAborted"
    """A rank ended by SIGABRT without a Python error: NCCL's watchdog aborts a rank whose collective
    outlived its timeout (or a library's C++ assertion failed). Retried like any rank failure,
    never re-planned: it is no memory shortage."""
    OUTPUT_FULL = "OutputFull"
    """The output volume ran out of space (or quota) while saving; retried, since space can be
    freed while the job waits, and the previous checkpoint is intact."""
    STORAGE_ACCESS_DENIED = "StorageAccessDenied"
    """Object storage refused the job's credentials (named by their Secret): not retried, a restart
    presents the same keys."""
    DOWNLOAD_TIMEOUT = "DownloadTimeout"
    """A pod's model download (or its wait for the other pods' downloads) outlived its own limit;
    retried: the restarted pod resumes the download from its cache claim."""
    NETWORK_ERROR = "NetworkError"
    """The collectives' transport failed (e.g. NCCL could not register memory with the RDMA
    device): retried like any rank failure, never re-planned, whatever errno text it carries."""
    PREEMPTED = "Preempted"
    """Asked to stop (SIGTERM: a Kueue preemption, an eviction, a node drain, a spot reclaim): the ranks
    stopped at a step boundary after saving a checkpoint. Not a failure: the gang restarts from that
    checkpoint without spending the restart budget."""

    @property
    def retried(self) -> bool:
        """Whether the operator restarts the gang after this root cause (`RETRIED`)."""
        return RETRIED[self]


RETRIED: Mapping[TerminationReason, bool] = {
    TerminationReason.OUT_OF_MEMORY: True,  # re-planned first (unless failurePolicy.onOutOfMemory is Fail)
    TerminationReason.DATA_ERROR: False,
    TerminationReason.DATA_UNAVAILABLE: True,
    TerminationReason.MODEL_NOT_FOUND: True,
    TerminationReason.CONFIG_ERROR: False,
    TerminationReason.TRAINING_ERROR: True,
    TerminationReason.TERMINATED: True,
    TerminationReason.RANK_KILLED: True,
    TerminationReason.RANK_ABORTED: True,
    TerminationReason.OUTPUT_FULL: True,
    TerminationReason.STORAGE_ACCESS_DENIED: False,
    TerminationReason.DOWNLOAD_TIMEOUT: True,
    TerminationReason.NETWORK_ERROR: True,
    TerminationReason.PREEMPTED: True,  # not even a failure: the restart spends no budget
}
"""Per reason, whether a gang restart can change it: the one table both sides read (the operator's
failure policy, the trainer's errors through their reason). Not retried are the job's own input
being wrong: an unreadable or impossible setting, a malformed record under
`dataset.onMalformedLine: Fail`, credentials the object store refuses."""

OUT_OF_MEMORY_PATTERN = re.compile(
    r"out of memory|OutOfMemory|can(no|')t allocate memory|std::bad_alloc|CUBLAS_STATUS_ALLOC_FAILED|OOMKilled|\bOOM\b",
    re.IGNORECASE,
)
"""Allocator failures of CUDA, cuBLAS, the host (C++ and libc) and the kubelet's OOMKilled."""

RDMA_REGISTRATION_PATTERN = re.compile(r"ibv_reg_(dmabuf_)?mr|ibv_create_(cq|qp)|RLIMIT_MEMLOCK", re.IGNORECASE)
"""NCCL's InfiniBand/RoCE transport failing to pin or register memory. Its text carries
`Cannot allocate memory` (ENOMEM from the verbs library, usually a locked-memory limit too low
for the pod's user), which is no GPU or host memory shortage: a re-plan would not help."""

NETWORK_HINT = (
    "NCCL could not register memory with the RDMA device: raise the pod's locked-memory limit "
    "(the container runtime's RLIMIT_MEMLOCK; IPC_LOCK does not lift it for a non-root user), "
    "or set NCCL_IB_DISABLE=1 in spec.env to fall back to TCP"
)

MAX_MESSAGE_LINE = 1000
"""Longest root-cause line a trainer writes (the kubelet keeps 4096 bytes of the message)."""


def is_rdma_registration_text(text: str) -> bool:
    return bool(RDMA_REGISTRATION_PATTERN.search(text))


def is_out_of_memory_text(text: str) -> bool:
    """An allocator failure, not an RDMA registration failure that reads like one."""
    return bool(OUT_OF_MEMORY_PATTERN.search(text)) and not is_rdma_registration_text(text)


def reason_of_line(line: str) -> TerminationReason | None:
    """The trainer's reason a root-cause line starts with, or None (not one of ours)."""
    head, sep, _ = line.strip().partition(":")
    if not sep:
        return None
    try:
        return TerminationReason(head)
    except ValueError:
        return None


class TrainingSummary(ApiModel):
    """What a successful run reports: the trainer writes it (termination message and completion
    marker), the operator copies it into `status.result`. Keys a newer trainer adds are
    ignored by an older operator, so the two can be upgraded separately."""

    model_config = ConfigDict(extra="ignore")

    steps: Annotated[int, Field(ge=0)]
    tokens: Annotated[int, Field(ge=0)]
    trained_tokens: Annotated[int, Field(ge=0)] | None = None
    """Tokens whose labels were trained (responses only, without padding or prompts)."""
    final_loss: float | None = None
    samples: Annotated[int, Field(ge=0)] = 0
    adapter_uri: str | None = None
    model_uri: str | None = None
    merged_model_uri: str | None = None
    wall_seconds: float | None = None
    eval_loss: float | None = None
    eval_loss_before: float | None = None
    eval_preference_accuracy: float | None = None
    """Preference objectives: the held-out pairs' accuracy at the final evaluation (`status.progress`)."""
    exact_match: float | None = None
    exact_match_before: float | None = None
    skipped_records: Annotated[int, Field(ge=0)] = 0
    resumed_from_step: Annotated[int, Field(ge=0)] | None = None
    """The checkpoint this run resumed from (unset: a fresh start)."""
    checkpoint_converted: bool | None = None
    """Whether that checkpoint was written under another strategy and converted to this run's."""
    tracking: TrackingResult | None = None
    """The run the entrypoint published to, once its last records were sent (or it gave up waiting)."""
    lora_skipped: list[str] | None = None
    """Matrix weights LoRA `all-linear` left frozen (a MoE's experts peft does not adapt), by layer-free name."""

    @classmethod
    def from_message(cls, text: str) -> TrainingSummary | None:
        """Parse a termination message; None when it is not a summary (a foreign or failed pod)."""
        try:
            return cls.model_validate_json(text, strict=False)
        except ValidationError:
            return None

    def to_message(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)

    def to_result(self) -> Result:
        return Result(
            adapter_uri=self.adapter_uri,
            model_uri=self.model_uri,
            merged_model_uri=self.merged_model_uri,
            final_loss=self.final_loss,
            eval_loss=self.eval_loss,
            eval_loss_before=self.eval_loss_before,
            exact_match=self.exact_match,
            exact_match_before=self.exact_match_before,
            skipped_records=self.skipped_records,
            steps=self.steps,
            tokens=self.tokens,
            trained_tokens=self.trained_tokens,
            wall_seconds=self.wall_seconds,
            tracking=self.tracking,
        )


class CheckpointFormat(StrEnum):
    TRAINABLE = "trainable"
    """The consolidated trainable state (LoRA, QLoRA): any strategy loads it."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed's own shards (full fine-tuning): read as they are under the same ZeRO stage and world
    size, converted once to a universal checkpoint (`step-N_universal`) under another one."""


class CheckpointState(ApiModel):
    """`trainer_state.json` of a checkpoint: where training resumes. Checkpoints written
    before these names were typed used the snake_case field names, which still parse."""

    global_step: Annotated[int, Field(ge=0)]
    tokens: Annotated[int, Field(ge=0)] = 0
    trained_tokens: Annotated[int, Field(ge=0)] = 0
    samples: Annotated[int, Field(ge=0)] = 0
    last_loss: float | None = None
    eval_before: dict[str, Any] | None = None
    data_position: dict[str, Any] | None = None
    strategy: Strategy | None = None
    checkpoint_format: CheckpointFormat | None = None

    def to_file(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2, exclude_none=True) + "\n"

    @classmethod
    def from_file(cls, text: str) -> CheckpointState:
        return cls.model_validate_json(text, strict=False)
