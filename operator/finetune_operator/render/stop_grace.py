"""How long a trainer pod may take to stop: its terminationGracePeriodSeconds, and the ranks' share.

On SIGTERM (a preemption, an eviction, a node drain) the ranks finish the step they are in, save a
checkpoint and exit (the trainer's `preemption`). The pod must be given that long, or the kubelet's
SIGKILL cuts the save short and every step since the previous checkpoint is lost. Until a save has
been measured the time is estimated from the plan: the bytes one pod writes for a checkpoint at an
assumed write bandwidth (twice for an s3:// output: staged, then uploaded). Once rank 0 has reported
its saves (`status.progress.checkpointSaveSeconds`), the measured figure is used. Either way with a
margin, plus the plan's step time for the step in flight, never below the operator's floor
(`RenderOptions.termination_grace_seconds`) nor above `CEILING_SECONDS`.

The entrypoint and the node launcher SIGKILL ranks that outlive their own grace
(FTJOB_STOP_GRACE_SECONDS): they get the pod's period less `RESERVE_SECONDS`, which leaves the
entrypoint time to write the termination message before the kubelet's SIGKILL.

The figure changes while a gang runs (a measurement arrives): it is no part of the gang's identity
(`manifests.gang_hash`), so it reaches the next pods without restarting the running ones.
"""

from __future__ import annotations

import math

from ..api.job import FineTuneJob
from ..api.status import PlanStatus
from .object_storage import output_on_s3

ASSUMED_WRITE_BYTES_PER_SECOND = 200 * 2**20
"""One pod's write to its output before any save was measured: a network file system or an object
store upload, not a local NVMe (slower storage is measured by the first save)."""
SAVE_MARGIN = 2.0
"""A save under load (a busier volume, a slower node) may take twice the estimate or the mean."""
MARGIN_SECONDS = 30
"""The signal's way through the entrypoint and the launcher, the agreement, the exits."""
CEILING_SECONDS = 3600
"""A stuck pod is not kept from its SIGKILL longer than this, whatever the estimate."""
RESERVE_SECONDS = 10
"""Of the pod's grace, what the entrypoint keeps for itself after the ranks' stop."""


def checkpoint_bytes_per_pod(job: FineTuneJob, plan: PlanStatus) -> int:
    """The most one pod writes for a checkpoint (node 0): the trainable state with its fp32 value and
    two Adam moments (12 bytes a parameter; LoRA and QLoRA save it consolidated on rank 0), and for
    full fine-tuning the optimizer partitions split over the nodes plus the 16-bit weights."""
    trainable = plan.trainable_parameters or 0
    if job.spec.method.traits.base_trains:
        return int(trainable * (12 / job.spec.resources.num_nodes + 2))
    return trainable * 12


def save_seconds(job: FineTuneJob, plan: PlanStatus) -> float:
    """The measured mean save of this job's ranks when known, else the plan's estimate."""
    progress = job.status.progress if job.status is not None else None
    if progress is not None and progress.checkpoint_save_seconds is not None:
        return progress.checkpoint_save_seconds
    passes = 2 if output_on_s3(job) else 1
    return passes * checkpoint_bytes_per_pod(job, plan) / ASSUMED_WRITE_BYTES_PER_SECOND


def termination_grace_seconds(job: FineTuneJob, plan: PlanStatus, floor: int) -> int:
    """The pods' terminationGracePeriodSeconds: the step in flight, the save with its margin."""
    step = plan.estimated_step_seconds or 0.0
    need = step + SAVE_MARGIN * save_seconds(job, plan) + MARGIN_SECONDS
    return max(floor, min(CEILING_SECONDS, math.ceil(need)))


def ranks_stop_seconds(grace: int) -> int:
    """FTJOB_STOP_GRACE_SECONDS: the entrypoint's and the launcher's wait for the ranks."""
    return max(1, grace - RESERVE_SECONDS)
