"""Experiment tracking of a job: the spec (`spec.tracking`), the result and the trainer's report.

A job is one MLflow run for its whole life (gang restarts, re-plans and preemptions continue
it), keyed by the job's uid; TensorBoard event files may be written beside it on the output
volume. Only the trainer talks to the tracking server: the operator renders the settings,
reads what rank 0 reports on its metrics endpoint (the `TRACKING_*` series below) and copies
the run into `status.result.tracking`. Credentials come from a Secret the pods read through
`secretKeyRef`; the operator never reads it.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field

from .base import CONTROL_CHARS, DNS_SUBDOMAIN_PATTERN, HTTP_URL_PATTERN, SECRET_KEY_PATTERN, SPACE_CHARS, ApiModel
from .pod_env import PodEnv

TRACKING_URI_PATTERN = HTTP_URL_PATTERN
TRACKING_URI_HINT = (
    "must be the http:// or https:// URL of an MLflow tracking server: scheme, host, optional port (1-65535) and "
    "path; no credentials, query or fragment (credentials go in tracking.mlflow.secretRef)"
)
_NAME_CHAR = f"[^{CONTROL_CHARS}]"
_NAME_END = f"[^{CONTROL_CHARS}{SPACE_CHARS}]"
EXPERIMENT_PATTERN = f"^{_NAME_END}({_NAME_CHAR}*{_NAME_END})?$"
EXPERIMENT_HINT = "must be an experiment name: no control characters, and no space at either end"

TENSORBOARD_DIR = "tensorboard"
"""Event files, under the job's output folder."""
TRACKING_DIR = "tracking"
"""The tracking journal and the publishers' status file, under the job's output folder."""

TRACKING_INFO_METRIC = "finetune_tracking_info"
"""Rank 0's gauge (value 1) naming the run: labels run_id, experiment_id, run_url, tracking_uri, tensorboard_dir."""
TRACKING_FAILING_METRIC = "finetune_tracking_failing"
"""1 while a sink (label sink: mlflow, tensorboard) cannot publish; label reason says why."""
TRACKING_PENDING_METRIC = "finetune_tracking_pending_records"
"""Records of a sink written to the output volume and not yet published."""


class MlflowSecretRef(ApiModel):
    """A Secret in the job's namespace with a bearer token, or a username and password."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] = Field(
        description="Secret name. Keys that are missing are left out (a Secret with only `token` is fine)."
    )
    token_key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)] = Field(
        default="token", description=f"Key of the bearer token ({PodEnv.MLFLOW_TRACKING_TOKEN})."
    )
    username_key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)] = Field(
        default="username", description=f"Key of the basic-auth user ({PodEnv.MLFLOW_TRACKING_USERNAME})."
    )
    password_key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)] = Field(
        default="password", description=f"Key of the basic-auth password ({PodEnv.MLFLOW_TRACKING_PASSWORD})."
    )


class MlflowTracking(ApiModel):
    """One MLflow run per job, created by rank 0 and continued by every later gang."""

    enabled: bool = Field(default=True, description="false: no MLflow run, even with the operator's default URI.")
    tracking_uri: Annotated[str, Field(max_length=512, pattern=TRACKING_URI_PATTERN)] | None = Field(
        default=None,
        description="URL of the MLflow tracking server as the trainer pods reach it. Unset: the operator's "
        "default (chart value tracking.mlflow.trackingUri); no default either: no MLflow run.",
    )
    experiment: Annotated[str, Field(min_length=1, max_length=256, pattern=EXPERIMENT_PATTERN)] | None = Field(
        default=None, description="Experiment name, created when missing. Unset: the job's namespace."
    )
    secret_ref: MlflowSecretRef | None = Field(
        default=None, description="Credentials for the server, read by the pods only (secretKeyRef)."
    )


class TensorBoardTracking(ApiModel):
    """TensorBoard event files with the same scalars as the MLflow run."""

    enabled: bool = Field(default=False, description="Write event files to <output>/tensorboard.")


class TrackingSpec(ApiModel):
    """Where the job's parameters, metrics and artifacts are published (by rank 0 only)."""

    mlflow: MlflowTracking | None = Field(default=None, description="An MLflow run for the job's whole life.")
    tensorboard: TensorBoardTracking | None = Field(default=None, description="TensorBoard event files.")


def mlflow_settings(tracking: TrackingSpec | None, default_uri: str | None) -> MlflowTracking | None:
    """The job's MLflow settings with the operator's default URI applied; None: no MLflow run."""
    mlflow = tracking.mlflow if tracking is not None else None
    if mlflow is not None and not mlflow.enabled:
        return None
    if mlflow is None:
        return MlflowTracking(tracking_uri=default_uri) if default_uri else None
    if mlflow.tracking_uri is None:
        return mlflow.model_copy(update={"tracking_uri": default_uri}) if default_uri else None
    return mlflow


def tracking_uri_problem(uri: str | None) -> str | None:
    """Why `uri` cannot be a tracking URI (as `ftjob validate` would say it), or None."""
    if uri is None or (len(uri) <= 512 and re.fullmatch(TRACKING_URI_PATTERN, uri)):
        return None
    return f"invalid value {uri!r}: {TRACKING_URI_HINT}"


def tensorboard_enabled(tracking: TrackingSpec | None) -> bool:
    return tracking is not None and tracking.tensorboard is not None and tracking.tensorboard.enabled


class TrackingResult(ApiModel):
    """The job's run, as rank 0 reported it (while running and in its summary). Keys a newer trainer
    adds are ignored, as in the rest of the summary."""

    model_config = ConfigDict(**{**ApiModel.model_config, "extra": "ignore"})

    run_id: Annotated[str, Field(max_length=128)] | None = None
    experiment_id: Annotated[str, Field(max_length=128)] | None = None
    run_url: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="The run in the MLflow UI (built from the tracking URI the pods use)."
    )
    tensorboard_log_dir: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="TensorBoard event files, as a path in the trainer pods."
    )
    failing: bool | None = Field(
        default=None,
        description="True while rank 0 cannot publish to MLflow; training goes on, and the records wait on the "
        "output volume until the server answers.",
    )
    reason: Annotated[str, Field(max_length=256)] | None = Field(
        default=None, description="Why publishing fails (e.g. ConnectionError, HTTP 401)."
    )
    unpublished_records: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Records MLflow had not received when the job ended (they stay in "
        "<output>/tracking/records.jsonl).",
    )
