"""The MLflow side of a job's tracking: its one run, its params and tags, metrics and artifacts.

The run is found by the tag `ftjob.uid` (the job's uid) in the job's experiment, or created:
every gang of the job (restarts, re-plans, Kueue preemptions) continues it. Each gang adds
the params the run lacks (MLflow refuses to change one: the first plan stays in the params,
and every re-plan becomes a `ftjob.replan.<n>` tag) and its plan and DeepSpeed config as
artifacts under `config/`.

Metrics go in `log_batch` calls of whole steps with the tag `ftjob.published_step` set to the
last step in the batch; a gang's first contact reads that tag and sends only later steps.
After a failed call the tag is read again before anything is re-sent (the call may have
reached the server); a batch sent twice anyway carries the same keys, steps, values and
timestamps, which MLflow's SQL store keeps once.

Only this module imports mlflow (the client, `mlflow-skinny`), and only in the publisher's
thread: its import takes seconds and must not delay the ranks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_trainer.tracking.journal import Record

UID_TAG = "ftjob.uid"
PUBLISHED_TAG = "ftjob.published_step"
MAX_BATCH_METRICS = 990
"""MLflow takes 1000 entities per log_batch; one is the published-step tag."""
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
"""The publisher retries by itself (with back-off, re-reading the run first); a request hangs at
most this long, so a slow server holds a publisher, never training, and never the end of a job
for long. A pod's env may set other values."""


@dataclass(frozen=True)
class RunSpec:
    """Everything a publisher needs to find or create the run, fixed for one gang."""

    tracking_uri: str
    experiment: str
    uid: str
    run_name: str
    params: dict[str, str]
    tags: dict[str, str]
    config_files: tuple[Path, ...] = ()
    """Files logged under `config/` (the rendered plan and DeepSpeed config)."""
    replan_tags: dict[str, str] = field(default_factory=dict)


def reason_of(exc: BaseException) -> str:
    """A short, stable word for why a call failed (a label value: no URLs, no ids)."""
    text = str(exc)
    code = getattr(exc, "error_code", None)
    if "timeout exception" in text or "timed out" in text.lower():
        return "timeout"
    status = re.search(r"error code (\d{3})", text)
    if status:
        return f"HTTP {status.group(1)}"
    if re.search(r"Connection refused|NewConnectionError|ConnectionError|Max retries exceeded|Name or service", text):
        return "unreachable"
    if isinstance(code, str) and code and code != "INTERNAL_ERROR":
        return code
    return type(exc).__name__


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _chunks(records: list[Record]) -> Iterator[list[Record]]:
    """Whole steps, at most MAX_BATCH_METRICS metrics each (a step with more goes alone)."""
    chunk: list[Record] = []
    count = 0
    for record in records:
        new_step = not chunk or record.step != chunk[-1].step
        if chunk and new_step and count + len(record.metrics) > MAX_BATCH_METRICS:
            yield chunk
            chunk, count = [], 0
        chunk.append(record)
        count += len(record.metrics)
    if chunk:
        yield chunk


class MlflowSink:
    name = "mlflow"

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.client: Any = None
        self.run_id = ""
        self.experiment_id = ""
        self.set_up = False

    @property
    def url(self) -> str:
        return run_url(self.spec.tracking_uri, self.experiment_id, self.run_id) if self.run_id else ""

    def connect(self) -> int:
        """Find or create the run (once per gang) and return its published step (-1: none)."""
        if self.client is None:
            for key, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(key, value)
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.spec.tracking_uri)
        if not self.run_id:
            self._find_or_create()
        run = self.client.get_run(self.run_id)
        if not self.set_up:
            self._set_up(run)
            run = self.client.get_run(self.run_id)
        return int(run.data.tags.get(PUBLISHED_TAG, "-1"))

    def _find_or_create(self) -> None:
        from mlflow.exceptions import MlflowException

        client, spec = self.client, self.spec
        experiment = client.get_experiment_by_name(spec.experiment)
        if experiment is None:
            try:
                self.experiment_id = client.create_experiment(spec.experiment)
            except MlflowException:  # created meanwhile by someone else
                experiment = client.get_experiment_by_name(spec.experiment)
                if experiment is None:
                    raise
        if experiment is not None:
            self.experiment_id = experiment.experiment_id
        uid = spec.uid.replace("'", "")
        found = client.search_runs([self.experiment_id], filter_string=f"tags.`{UID_TAG}` = '{uid}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
        else:
            run = client.create_run(self.experiment_id, run_name=spec.run_name, tags={**spec.tags, UID_TAG: spec.uid})
            self.run_id = run.info.run_id

    def _set_up(self, run: Any) -> None:
        """This gang's params, tags and config files; the run marked RUNNING again."""
        from mlflow.entities import Param, RunTag

        client, spec = self.client, self.spec
        if run.info.status != "RUNNING":
            client.update_run(self.run_id, status="RUNNING")
        params = [Param(k, v) for k, v in spec.params.items() if k not in run.data.params]
        tags = [RunTag(k, v) for k, v in {**spec.tags, **spec.replan_tags}.items()]
        for i in range(0, max(len(params), len(tags)), 100):
            client.log_batch(self.run_id, params=params[i : i + 100], tags=tags[i : i + 100])
        for path in spec.config_files:
            if path.is_file():
                client.log_artifact(self.run_id, str(path), "config")
        self.set_up = True

    def publish(self, records: list[Record]) -> None:
        from mlflow.entities import Metric, RunTag

        for chunk in _chunks(records):
            metrics = [Metric(k, v, r.time_ms, r.step) for r in chunk for k, v in sorted(r.metrics.items())]
            self.client.log_batch(self.run_id, metrics=metrics, tags=[RunTag(PUBLISHED_TAG, str(chunk[-1].step))])

    def finish(self, artifacts: list[tuple[Path, str]], pointers: dict[str, str], failed: bool) -> None:
        """The job's outputs (`(path, artifact dir)`; `pointers`: tag name → where a large one is) and the end."""
        from mlflow.entities import RunTag

        client = self.client
        if pointers:
            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in pointers.items()])
        for path, where in artifacts:
            if path.is_dir():
                client.log_artifacts(self.run_id, str(path), where)
            elif path.is_file():
                client.log_artifact(self.run_id, str(path), where)
        client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")

    def mark_failed(self) -> None:
        self.client.set_terminated(self.run_id, status="FAILED")
