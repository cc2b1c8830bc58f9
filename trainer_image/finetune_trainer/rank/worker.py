"""One training rank, as started by the node launcher (`python -m finetune_trainer.rank.worker`).

It joins the process group (gloo on CPU, nccl on GPU), serves its metrics, trains, and
leaves its outcome in the run-state folder the entrypoint gave it (FTJOB_RUN_STATE_DIR):
the summary (local rank 0), the `Preempted` line once a stop's checkpoint is saved (local rank
0, see `preemption`), or a one-line root cause (any failing rank). Global rank 0 writes the
completion marker last, once every rank has saved its share.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from finetune_operator.api.pod_env import PodEnv
from finetune_trainer import log_filters, preemption
from finetune_trainer.checkpoint.s3_checkpoints import publish_completion
from finetune_trainer.outcome import SUMMARY_FILE, failure_line, mark_rank, write_rank_failure
from finetune_trainer.storage.paths import completion_marker

log = logging.getLogger("finetune_trainer")


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s",
        stream=sys.stdout,
        force=True,
    )
    logging.getLogger("finetune_trainer").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log_filters.install()


def _cpu_threads(local_world: int) -> None:
    import torch

    if torch.cuda.is_available() or os.environ.get(PodEnv.OMP_NUM_THREADS):
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))


def _name_process(rank: int) -> None:
    """`ftjob-rank-N` in ps and top, whether the launcher forked this rank or started it afresh."""
    with contextlib.suppress(OSError):  # no procfs: the name is only a convenience
        Path("/proc/self/comm").write_text(f"ftjob-rank-{rank}"[:15])


def run_rank(config_dir: str) -> int:
    rank = int(os.environ.get(PodEnv.RANK, "0"))
    local_rank = int(os.environ.get(PodEnv.LOCAL_RANK, "0"))
    state_dir = Path(os.environ.get(PodEnv.FTJOB_RUN_STATE_DIR, "/tmp/ftjob-run-state"))
    _name_process(rank)
    _setup_logging(rank)
    mark_rank(state_dir, rank, "started")
    preemption.install()
    try:
        from finetune_trainer.atomic_json import write_json_atomic
        from finetune_trainer.metrics import RankMetrics, metrics_enabled, new_registry, serve
        from finetune_trainer.rank.loop import Trainer
        from finetune_trainer.settings import load_config

        cfg = load_config(config_dir)
        from finetune_trainer.deepspeed_import import import_deepspeed

        deepspeed = import_deepspeed()
        import torch

        from finetune_trainer.rank.collective_check import install_from_env
        from finetune_trainer.rank.devices import process_group_backend

        install_from_env(rank)

        _cpu_threads(int(os.environ.get(PodEnv.LOCAL_SIZE, "1")))
        backend = process_group_backend(cfg.job.spec.resources.gpus_per_node)
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        minutes = float(os.environ.get("FTJOB_DIST_TIMEOUT_MINUTES", "30"))
        timeout = timedelta(minutes=minutes)
        deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        metrics = None
        if metrics_enabled():
            registry = new_registry()
            info = {
                "rank": str(rank),
                "local_rank": str(local_rank),
                "zero_stage": str(cfg.plan.zero_stage),
                "method": str(cfg.job.spec.method.type),
                "UUID": _gpu_uuid(local_rank),
            }
            planned = cfg.plan.breakdown.model_dump(by_alias=False)
            metrics = RankMetrics(registry, info, on_gpu=torch.cuda.is_available(), planned=planned)
            if rank == 0:
                from finetune_trainer.metrics.tracking import TrackingCollector
                from finetune_trainer.tracking.status import status_path

                registry.register(TrackingCollector(status_path(cfg.output)))
            serve(registry, local_rank)
        trainer = Trainer(cfg, local_rank, metrics, progress=os.environ.get(PodEnv.FTJOB_PROGRESS) == "1")
        trainer.setup()
        try:
            summary = trainer.run()
        except preemption.Preempted as stop:  # the checkpoint is saved: a stop, not a failure
            if local_rank == 0:
                write_json_atomic(state_dir / preemption.PREEMPTED_FILE, {"line": str(stop)})
            if rank == 0:
                log.warning("%s", stop)
            torch.distributed.destroy_process_group()
            mark_rank(state_dir, rank, "done")
            return 0
        wire = summary.model_dump(by_alias=True, exclude_none=True)
        if local_rank == 0:
            write_json_atomic(state_dir / SUMMARY_FILE, wire)
        if rank == 0:
            write_json_atomic(completion_marker(cfg.output), wire)
            publish_completion(cfg.job.spec, wire)
            log.info("done: %s", summary.to_message())
        torch.distributed.destroy_process_group()
        mark_rank(state_dir, rank, "done")
        return 0
    except BaseException as exc:  # every failure must leave a root cause
        line = failure_line(exc, rank)
        write_rank_failure(state_dir, rank, line)
        traceback.print_exc()
        print(line, file=sys.stderr, flush=True)
        return 1


def _gpu_uuid(local_rank: int) -> str:
    import torch

    if not torch.cuda.is_available():
        return ""
    uuid = str(getattr(torch.cuda.get_device_properties(local_rank), "uuid", ""))
    return uuid if uuid.startswith("GPU-") or not uuid else f"GPU-{uuid}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer.rank.worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--local_rank", type=int, default=None, help="DeepSpeed's launcher passes it (unused)")
    args = parser.parse_args(argv)
    return run_rank(args.config)


if __name__ == "__main__":
    sys.exit(main())
