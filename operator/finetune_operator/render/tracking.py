"""What experiment tracking adds to a job's pods: the resolved settings and their environment.

The operator's default tracking URI (chart value `tracking.mlflow.trackingUri`) is written into
the job the pods receive (`job.json`), so the trainer reads one complete `spec.tracking`.
The pods get the job's uid (the key of its one MLflow run; a pod cannot read its owner's
uid), the trainer image (for the run's tags) and, with `secretRef`, MLflow's credential
variables through `secretKeyRef` marked optional: a Secret holding only a token is enough,
and a missing one leaves the run unauthenticated (a Warning from rank 0, never a pod that
cannot start). The operator itself never reads the Secret.
"""

from __future__ import annotations

from typing import Any

from ..api.job import FineTuneJob
from ..api.pod_env import PodEnv
from ..api.tracking import TrackingSpec, mlflow_settings
from .env_entries import secret_entry, value_entry


def with_default_tracking(job: FineTuneJob, default_uri: str | None) -> FineTuneJob:
    """The job with the operator's default tracking URI filled in where it names none."""
    tracking = job.spec.tracking
    mlflow = mlflow_settings(tracking, default_uri)
    current = tracking.mlflow if tracking is not None else None
    if mlflow is None or mlflow == current:
        return job
    resolved = (tracking or TrackingSpec()).model_copy(update={"mlflow": mlflow})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"tracking": resolved})})


def tracking_env(job: FineTuneJob, image: str, user_names: set[str]) -> list[dict[str, Any]]:
    """The pod env MLflow tracking needs (none without an MLflow run); `user_names` (spec.env) win."""
    mlflow = mlflow_settings(job.spec.tracking, None)
    if mlflow is None:
        return []
    env: list[dict[str, Any]] = [value_entry(PodEnv.FTJOB_IMAGE, image)]
    if job.metadata.uid:
        env.append(value_entry(PodEnv.FTJOB_JOB_UID, job.metadata.uid))
    ref = mlflow.secret_ref
    if ref is not None:
        keys = (
            (PodEnv.MLFLOW_TRACKING_TOKEN, ref.token_key),
            (PodEnv.MLFLOW_TRACKING_USERNAME, ref.username_key),
            (PodEnv.MLFLOW_TRACKING_PASSWORD, ref.password_key),
        )
        for name, key in keys:
            if name not in user_names:
                env.append(secret_entry(name, ref.name, key, optional=True))
    return env
