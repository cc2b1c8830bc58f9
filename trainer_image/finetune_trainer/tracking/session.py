"""A pod's tracking, from its entrypoint: publishers started with the ranks, finished after them.

Only node 0's entrypoint tracks (rank 0 writes the journal on the shared output volume). It
starts one publisher per sink before launching the ranks and, when they succeeded, waits up to
FTJOB_TRACKING_FLUSH_SECONDS (default 60) for the last records, logs the outputs (the adapter,
or a pointer to it when larger than FTJOB_TRACKING_ARTIFACT_MAX_BYTES, default 512 MiB) and
ends the run; the summary then names the run, and how many records MLflow never received. A
failed gang marks the run FAILED (the next gang marks it RUNNING again); a stopped one (a gang
restart, a suspension) leaves it as it is. The run is keyed by the job's uid; `ftjob run` has
no job, so it keys the run by an id kept in the output folder, and a rerun into the same
folder continues the run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from pathlib import Path

from finetune_operator.api.pod_contract import TrainingSummary
from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.tracking import (
    TENSORBOARD_DIR,
    TRACKING_DIR,
    TrackingResult,
    mlflow_settings,
    tensorboard_enabled,
)
from finetune_trainer.checkpoint.s3_checkpoints import publish_tracking
from finetune_trainer.settings import JobConfig, env_int
from finetune_trainer.storage import paths
from finetune_trainer.tracking.journal import journal_path
from finetune_trainer.tracking.mlflow_sink import MlflowSink, RunSpec
from finetune_trainer.tracking.params import replan_tags, run_params, run_tags
from finetune_trainer.tracking.publisher import Publisher
from finetune_trainer.tracking.recorder import tracking_configured
from finetune_trainer.tracking.status import StatusBoard, TrackingStatus, status_path
from finetune_trainer.tracking.tensorboard_sink import TensorBoardSink

log = logging.getLogger(__name__)

FLUSH_ENV = "FTJOB_TRACKING_FLUSH_SECONDS"
ARTIFACT_MAX_ENV = "FTJOB_TRACKING_ARTIFACT_MAX_BYTES"
RUN_KEY_FILE = "run-key"
MARK_FAILED_S = 5.0
STOP_DRAIN_S = 5.0


def run_key(output: Path) -> str:
    """The job's uid in a pod; for `ftjob run`, an id made once and kept in the output folder."""
    uid = os.environ.get(PodEnv.FTJOB_JOB_UID, "")
    if uid:
        return uid
    path = output / TRACKING_DIR / RUN_KEY_FILE
    try:
        return path.read_text().strip() or _new_key(path)
    except FileNotFoundError:
        return _new_key(path)


def _new_key(path: Path) -> str:
    key = f"local-{uuid.uuid4()}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(key + "\n")
    return key


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


class TrackingSession:
    def __init__(self, cfg: JobConfig, board: StatusBoard, publishers: list[Publisher]) -> None:
        self.cfg = cfg
        self.board = board
        self.publishers = publishers
        self.mlflow = next((p for p in publishers if isinstance(p.sink, MlflowSink)), None)

    @classmethod
    def start(cls, cfg: JobConfig) -> TrackingSession | None:
        """Publishers for the job's sinks, started; None when the job is not tracked."""
        if not tracking_configured(cfg):
            return None
        output, tracking = cfg.output, cfg.job.spec.tracking
        previous = TrackingStatus.read(status_path(output)) or TrackingStatus()
        mlflow = mlflow_settings(tracking, None)
        board = StatusBoard(
            status_path(output),
            TrackingStatus(
                run_id=previous.run_id,
                experiment_id=previous.experiment_id,
                run_url=previous.run_url,
                tracking_uri=(mlflow.tracking_uri or "") if mlflow else "",
                tensorboard_dir=str(output / TENSORBOARD_DIR) if tensorboard_enabled(tracking) else "",
            ),
        )
        journal = journal_path(output)
        publishers: list[Publisher] = []
        if mlflow is not None and mlflow.tracking_uri:
            meta = cfg.job.metadata
            spec = RunSpec(
                tracking_uri=mlflow.tracking_uri,
                experiment=mlflow.experiment or meta.namespace or "default",
                uid=run_key(output),
                run_name=meta.name,
                params=run_params(cfg),
                tags=run_tags(cfg, os.environ.get(PodEnv.FTJOB_IMAGE, "")),
                config_files=(cfg.directory / "plan.json", cfg.directory / "deepspeed.json"),
                replan_tags=replan_tags(cfg.plan),
            )
            publishers.append(_MlflowPublisher(MlflowSink(spec), journal, board))
        if tensorboard_enabled(tracking):
            publishers.append(Publisher(TensorBoardSink(output / TENSORBOARD_DIR), journal, board))
        return cls(cfg, board, [p.start() for p in publishers])

    def finish(self, summary: TrainingSummary) -> TrackingResult:
        """After the ranks succeeded: the last records, the outputs, the run ended (bounded in time)."""
        deadline = time.monotonic() + env_int(FLUSH_ENV, 60)
        artifacts, pointers = self._outputs(summary)
        unpublished: int | None = None
        reason = ""
        for publisher in self.publishers:  # all at once: a server that is down holds back no other sink
            publisher.start_draining()
        for publisher in self.publishers:
            drained = publisher.drain(deadline)
            stopped = publisher.stop()
            if drained and stopped:
                try:
                    publisher.sink.finish(artifacts, pointers, failed=False)
                    continue
                except Exception as exc:
                    log.warning("tracking: %s: outputs not logged: %s", publisher.sink.name, str(exc)[:300])
            if publisher is self.mlflow:
                unpublished, reason = publisher.pending(), publisher.reason
                log.warning("tracking: %d records not sent to MLflow (%s); they stay in %s", unpublished,
                            reason or "no answer", journal_path(self.cfg.output))  # fmt: skip
        publish_tracking(self.cfg.job.spec, self.cfg.output)  # the journal and event files, now complete
        return self.result(unpublished, reason)

    def _outputs(self, summary: TrainingSummary) -> tuple[list[tuple[Path, str]], dict[str, str]]:
        limit = env_int(ARTIFACT_MAX_ENV, 512 * 2**20)
        artifacts: list[tuple[Path, str]] = []
        pointers: dict[str, str] = {}
        for name, where in (("adapter", summary.adapter_uri), ("model", summary.model_uri),
                            ("merged", summary.merged_model_uri)):  # fmt: skip
            if not where:
                continue
            pointers[f"ftjob.{name}_uri"] = where
            local = paths.result_folder(where)  # pvc:// and file:// name a folder on this pod
            size = _size(local) if local is not None else 0
            if local is not None and name == "adapter" and 0 < size <= limit:
                artifacts.append((local, name))
            elif size:
                pointers[f"ftjob.{name}_artifact"] = (
                    f"not uploaded: {size / 2**20:.0f} MiB (uploads are up to {ARTIFACT_MAX_ENV}={limit} bytes); "
                    f"it is at {where}"
                )
        return artifacts, pointers

    def result(self, unpublished: int | None = None, reason: str = "") -> TrackingResult:
        status = self.board.snapshot()
        return TrackingResult(
            run_id=status.run_id or None,
            experiment_id=status.experiment_id or None,
            run_url=status.run_url or None,
            tensorboard_log_dir=status.tensorboard_dir or None,
            reason=(reason or "no answer") if unpublished else None,
            unpublished_records=unpublished,
        )

    def stop(self, failed: bool) -> None:
        """After a failure (the run is marked FAILED, briefly tried) or a stop signal: what the last
        checkpoint holds is sent for a few seconds more (the next gang sends the rest)."""
        deadline = time.monotonic() + STOP_DRAIN_S
        for publisher in self.publishers:
            publisher.start_draining()
        for publisher in self.publishers:
            publisher.drain(deadline)
            stopped = publisher.stop()
            if failed and stopped and publisher.published is not None:
                _bounded(publisher.sink.mark_failed, MARK_FAILED_S)


def start_session(cfg: JobConfig) -> TrackingSession | None:
    """`TrackingSession.start`, or None (logged) when even that fails: tracking never stops a job."""
    try:
        return TrackingSession.start(cfg)
    except Exception as exc:
        log.warning("tracking: not started: %s", str(exc)[:300])
        return None


class _MlflowPublisher(Publisher):
    """The MLflow publisher also names the run in the status file once it found or created it."""

    def _healthy(self, idle: bool) -> None:
        sink = self.sink
        assert isinstance(sink, MlflowSink)
        if sink.run_id and self.board.snapshot().run_id != sink.run_id:
            self.board.update_run(run_id=sink.run_id, experiment_id=sink.experiment_id, run_url=sink.url)
            print(f"tracking: MLflow run {sink.url}", flush=True)
        super()._healthy(idle)


def _bounded(call: object, seconds: float) -> None:
    """Run `call` in a daemon thread for at most `seconds` (a server that hangs must not hold the pod)."""

    def body() -> None:
        try:
            call()  # type: ignore[operator]
        except Exception as exc:
            log.warning("tracking: %s", str(exc)[:300])

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(seconds)
