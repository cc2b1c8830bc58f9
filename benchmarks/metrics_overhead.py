"""Step time with the rank's metrics and communication accounting on vs off (target: < 3 %).

Runs the real pod entrypoint (`ftjob train`) on 2 CPU ranks (gloo) with the demo model
(builtin://tiny-llama, LoRA) three ways, one after the other, under each ZeRO stage asked:

- off:      FTJOB_METRICS=off (no registry, no exporter, deepspeed.comm untouched);
- on:       everything this project exports, served on a free port, plus the per-step walk of
            the model-state tensors and our timing wrapper around every collective;
- dslogger: metrics off, DeepSpeed's own comms logger on for every op (`comms_logger`
            {enabled, prof_all} in deepspeed.json): the alternative we did not choose.

`--paired` (the number to quote) runs once per stage with everything on and
FTJOB_METRICS_ALTERNATE=1: the accounting is paused on the middle two steps of every
block of four (on, off, off, on), so steps with and without it interleave in one process
and share whatever else the machine is doing. Each block gives the ratio of its "on" to
its "off" whole iterations (hooks included); a linear drift and any odd/even-step pattern
cancel inside a block. The median over blocks is printed. Separate runs (the default mode)
differ by more than the effect on a shared machine.

`--tracking` compares instead runs with everything on ("on") and the same plus experiment
tracking ("tracking": a real MLflow server on loopback, from `finetune_localcluster.mlflow_server`,
and TensorBoard files), both checkpointing every 5 steps so the journal and the publishers work
during the run; the ratio of median step times is printed (target: at most 1.01). The
publishers run in the entrypoint, not in a rank: what a rank adds is one dictionary per step
and a journal append per checkpoint.

`--micro` measures instead, in one process, what the accounting adds per collective (a
small all-reduce on a 1-rank gloo group, wrapped vs bare) and per step (the loop's hooks
with the model-state walk of a small module): per-call cost x calls per step + hook cost,
over a step time, is an overhead estimate that the noise of a shared machine cannot blur.

The step time is the loop's own wall clock per optimizer step (train_log.jsonl), median over
the steps after the first two (set-up, ZeRO-3 trace recording). On a shared 2-core machine the
noise between runs is a few per cent, so the rounds are interleaved and repeated.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/metrics_overhead.py --paired [--stages 2 3] [--steps 60]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/metrics_overhead.py [--stages 2 3] [--steps 20] [--rounds 2]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/metrics_overhead.py --tracking [--stages 2] [--steps 60] [--rounds 3]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/metrics_overhead.py --smoke   # --paired, ZeRO-2, 12 steps; --micro

A run that fails, or a paired run with fewer than two complete blocks, ends the benchmark with
exit status 1 and no table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "operator", REPO / "trainer_image"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

MODES = ("off", "on", "dslogger")
TRACKING_MODES = ("on", "tracking")
SKIP = 2


def manifest(stage: int, steps: int, tracking_uri: str | None = None) -> dict[str, object]:
    from tests.support.training_runs import job_manifest

    training: dict[str, object] = {"maxSteps": steps, "microBatchSize": 4, "globalBatchSize": 8, "precision": "fp32"}
    extra: dict[str, object] = {}
    if tracking_uri is not None:  # both sides of the tracking comparison checkpoint alike
        training["checkpointEverySteps"] = 5
        if tracking_uri:
            extra["tracking"] = {"mlflow": {"trackingUri": tracking_uri, "experiment": "overhead"},
                                 "tensorboard": {"enabled": True}}  # fmt: skip
    return job_manifest(
        "builtin://tiny-llama",
        "builtin://reverse-words",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.01},
        method={"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        training=training,
        deepspeed={"zeroStage": stage},
        **extra,
    )


def run_once(stage: int, steps: int, mode: str, workdir: Path, tracking_uri: str | None = None) -> float:
    from finetune_localcluster.ports import free_port
    from tests.support.training_runs import render_config, start_train

    uri = None if tracking_uri is None else (tracking_uri if mode == "tracking" else "")
    config = render_config(workdir / "config", manifest(stage, steps, uri))
    env = {"FTJOB_METRICS": "on" if mode in ("on", "tracking") else "off", "FTJOB_METRICS_PORT": str(free_port())}
    if mode == "dslogger":
        ds_path = config / "deepspeed.json"
        ds = json.loads(ds_path.read_text())
        ds["comms_logger"] = {"enabled": True, "prof_all": True, "verbose": False}
        ds_path.write_text(json.dumps(ds))
    run = start_train(config, workdir / "out", env=env, tag=mode)
    if run.wait(900) != 0:
        raise RuntimeError(f"{mode} ZeRO-{stage} failed:\n{run.log()[-3000:]}")
    seconds = [float(e["seconds"]) for e in run.train_log() if "seconds" in e][SKIP:]
    if not seconds:
        raise RuntimeError(f"{mode} ZeRO-{stage}: no step after the first {SKIP} in the train log")
    return statistics.median(seconds)


def paired(stage: int, steps: int, workdir: Path) -> tuple[list[float], float, float]:
    """(block on/off ratios, median on iteration s, median off iteration s) of one run."""
    from finetune_localcluster.ports import free_port
    from tests.support.training_runs import render_config, start_train

    config = render_config(workdir / "config", manifest(stage, steps))
    env = {"FTJOB_METRICS": "on", "FTJOB_METRICS_ALTERNATE": "1", "FTJOB_METRICS_PORT": str(free_port())}
    run = start_train(config, workdir / "out", env=env, tag="paired")
    if run.wait(900) != 0:
        raise RuntimeError(f"paired ZeRO-{stage} failed:\n{run.log()[-3000:]}")
    rows = [e for e in run.train_log() if "iteration_seconds" in e]
    blocks: dict[int, dict[str, float]] = {}
    for row in rows:
        block = (int(row["step"]) - 1) // 4
        if block >= 1:  # the first block holds set-up (and ZeRO-3's trace recording)
            sums = blocks.setdefault(block, {"on": 0.0, "off": 0.0, "n": 0})
            sums[row["metrics"]] += row["iteration_seconds"]
            sums["n"] += 1
    ratios = [b["on"] / b["off"] for b in blocks.values() if b["n"] == 4]
    if len(ratios) < 2:
        raise RuntimeError(f"paired ZeRO-{stage}: {len(ratios)} complete blocks of four steps after the first (need 2)")
    on = [r["iteration_seconds"] for r in rows[4:] if r["metrics"] == "on"]
    off = [r["iteration_seconds"] for r in rows[4:] if r["metrics"] == "off"]
    return ratios, statistics.median(on), statistics.median(off)


def micro(calls: int = 3000, rounds: int = 300) -> None:
    import os
    import time

    import deepspeed.comm as dist
    import torch
    from prometheus_client import generate_latest

    from finetune_localcluster.ports import free_port
    from finetune_trainer.deepspeed_import import import_deepspeed
    from finetune_trainer.metrics import RankMetrics, new_registry

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    deepspeed = import_deepspeed()  # without its CPU shm op, as the trainer's ranks
    deepspeed.init_distributed("gloo")
    tensor = torch.ones(16)

    def per_call() -> float:
        for _ in range(200):
            dist.all_reduce(tensor)
        began = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(tensor)
        return (time.perf_counter() - began) / calls

    bare = min(per_call() for _ in range(3))
    dist.configure(enabled=True, prof_all=True)
    ds_logger = min(per_call() for _ in range(3))
    dist.configure(enabled=False)
    info = {"rank": "0", "local_rank": "0", "zero_stage": "3", "method": "lora", "UUID": ""}
    registry = new_registry()
    metrics = RankMetrics(registry, info, on_gpu=False, planned={"weights": 1})
    wrapped = min(per_call() for _ in range(3))

    class Engine:  # 128 small tensors with Adam: the walk, not the arithmetic, dominates
        def __init__(self) -> None:
            self.module = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(64)])
            self.optimizer = torch.optim.AdamW(self.module.parameters())

    watched, bare_engine = Engine(), Engine()
    metrics.engine_ready(watched)
    for engine in (watched, bare_engine):
        engine.module(torch.ones(2, 32)).sum().backward()
        engine.optimizer.step()

    def loop(engine: Engine, hooked: bool) -> float:
        began = time.perf_counter()
        for i in range(rounds):
            if hooked:
                metrics.step_started()
            engine.optimizer.step()
            if hooked:
                metrics.step_done(step=i, epoch=0.0, loss=1.0, lr=1e-3, grad_norm=1.0, samples=8, tokens=256,
                                  seconds=0.1, wait_seconds=0.0, model_params=1000)  # fmt: skip
        return (time.perf_counter() - began) / rounds

    hooks = min(loop(watched, True) for _ in range(3)) - min(loop(bare_engine, False) for _ in range(3))
    scrape = min(_time(lambda: generate_latest(registry)) for _ in range(20))
    metrics.close()
    print(f"per collective: bare {bare * 1e6:.1f} us, wrapped {wrapped * 1e6:.1f} us, "
          f"added {(wrapped - bare) * 1e6:.1f} us; DeepSpeed comms logger {ds_logger * 1e6:.1f} us, "
          f"added {(ds_logger - bare) * 1e6:.1f} us")  # fmt: skip
    print(f"per step: loop hooks + model-state walk (64 x Linear(32, 32) with AdamW) {hooks * 1e6:.0f} us; "
          f"one /metrics scrape {scrape * 1e3:.2f} ms (exporter thread)")  # fmt: skip


def tracking(stages: list[int], steps: int, rounds: int) -> int:
    """Median step time with everything on, without and with tracking to a real MLflow server."""
    from finetune_localcluster.mlflow_server import MlflowServer

    results: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tracking-overhead-") as tmp, MlflowServer(Path(tmp) / "mlflow") as server:
        for stage in stages:
            for rnd in range(rounds):
                for mode in TRACKING_MODES if rnd % 2 == 0 else tuple(reversed(TRACKING_MODES)):
                    median = run_once(stage, steps, mode, Path(tmp) / f"z{stage}-{mode}-{rnd}", server.url)
                    results.setdefault((stage, mode), []).append(median)
                    print(f"ZeRO-{stage} round {rnd} {mode:<9} median step {median * 1000:8.2f} ms", flush=True)
        record_s, commit_s = recorder_costs()
        publish_s = publisher_cpu(server.url, Path(tmp) / "publish")
    print(f"\nrank 0, in its training thread: record() {record_s * 1e6:.1f} us a step; commit() of 5 steps "
          f"{commit_s * 1e3:.2f} ms a checkpoint (journal append + fsync)")  # fmt: skip
    print(f"entrypoint (another process): {publish_s * 1e3:.2f} ms of CPU a step to publish it to MLflow")
    print(f"\n{'stage':<8}{'on ms':>10}{'tracking ms':>13}{'tracking/on':>13}{'rank 0 share':>14}{'publisher CPU':>15}")
    for stage in stages:
        on, tracked = (statistics.median(results[(stage, m)]) for m in TRACKING_MODES)
        share = (record_s + commit_s / 5) / on
        print(f"ZeRO-{stage:<3}{on * 1e3:>10.2f}{tracked * 1e3:>13.2f}{tracked / on:>13.3f}{share:>14.5f}"
              f"{publish_s / on:>15.5f}")  # fmt: skip
    return 0


def publisher_cpu(url: str, workdir: Path, steps: int = 1000) -> float:
    """CPU seconds per step that publishing costs the entrypoint (JSON, HTTP client), after the import."""
    import time

    from finetune_trainer.tracking.journal import JournalWriter, Record, journal_path
    from finetune_trainer.tracking.mlflow_sink import MlflowSink, RunSpec
    from finetune_trainer.tracking.publisher import Publisher
    from finetune_trainer.tracking.status import StatusBoard, TrackingStatus, status_path

    metrics = {"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 1.2, "tokens_per_second": 900.0, "epoch": 0.5,
               "memory_peak_bytes": 2.0**30, "memory_peak_vs_plan": 0.9}  # fmt: skip
    spec = RunSpec(url, "publisher-cpu", f"bench-{time.time()}", "bench", {}, {})
    sink = MlflowSink(spec)
    sink.connect()  # the import and the run: once per gang
    journal = journal_path(workdir)
    publisher = Publisher(sink, journal, StatusBoard(status_path(workdir), TrackingStatus()))
    JournalWriter(journal).append([Record(s, s, metrics) for s in range(1, steps + 1)])
    began = time.process_time()
    publisher.start()
    while publisher.published != steps:
        time.sleep(0.01)
    cpu = time.process_time() - began
    publisher.stop()
    return cpu / steps


def recorder_costs(steps: int = 2000) -> tuple[float, float]:
    """What the loop pays for tracking: seconds per `record` and per `commit` of 5 steps."""
    import time

    from finetune_trainer.tracking.journal import JournalWriter, journal_path
    from finetune_trainer.tracking.recorder import Recorder, memory_peak_reader

    entry = {"step": 0, "loss": 2.5, "lr": 1e-4, "grad_norm": 1.2, "tokens_per_second": 900.0, "epoch": 0.5}
    with tempfile.TemporaryDirectory(prefix="recorder-") as tmp:
        recorder = Recorder(JournalWriter(journal_path(Path(tmp))), 2**30, memory_peak_reader(False))
        began = time.perf_counter()
        for step in range(1, steps + 1):
            recorder.record({**entry, "step": step})
        record_s = (time.perf_counter() - began) / steps
        recorder.held.clear()
        commits: list[float] = []
        for block in range(200):
            for step in range(5):
                recorder.record({**entry, "step": steps + block * 5 + step + 1})
            began = time.perf_counter()
            recorder.commit()
            commits.append(time.perf_counter() - began)
    return record_s, statistics.median(commits)


def _time(body: Callable[[], object]) -> float:
    import time

    began = time.perf_counter()
    body()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--micro", action="store_true", help="per-call and per-step costs in one process")
    parser.add_argument("--paired", action="store_true", help="accounting on and off on alternate steps of one run")
    parser.add_argument("--tracking", action="store_true", help="everything on, without and with experiment tracking")
    parser.add_argument("--smoke", action="store_true", help="--paired on ZeRO-2 for 12 steps, then a short --micro")
    args = parser.parse_args(argv)
    try:
        if args.smoke:
            print_paired([2], 12)
            micro(calls=100, rounds=10)
        elif args.tracking:
            return tracking(args.stages, args.steps, args.rounds)
        elif args.micro:
            micro()
        elif args.paired:
            print_paired(args.stages, args.steps)
        else:
            separate_runs(args.stages, args.steps, args.rounds)
    except RuntimeError as exc:
        print(f"metrics_overhead: measurement failed, no table: {exc}", file=sys.stderr)
        return 1
    return 0


def print_paired(stages: list[int], steps: int) -> None:
    """One paired run per stage; the table comes after every run measured."""
    lines = [f"{'stage':<8}{'blocks':>7}{'on ms':>10}{'off ms':>10}{'on/off median':>15}{'quartiles':>16}"]
    with tempfile.TemporaryDirectory(prefix="metrics-overhead-") as tmp:
        for stage in stages:
            ratios, on, off = paired(stage, steps, Path(tmp) / f"z{stage}")
            q1, med, q3 = statistics.quantiles(ratios, n=4)
            lines.append(f"ZeRO-{stage:<3}{len(ratios):>7}{on * 1e3:>10.2f}{off * 1e3:>10.2f}{med:>15.3f}"
                         f"{f'{q1:.3f}-{q3:.3f}':>16}")  # fmt: skip
    print("\n".join(lines), flush=True)


def separate_runs(stages: list[int], steps: int, rounds: int) -> None:
    results: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="metrics-overhead-") as tmp:
        for stage in stages:
            for rnd in range(rounds):
                order = MODES if rnd % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    median = run_once(stage, steps, mode, Path(tmp) / f"z{stage}-{mode}-{rnd}")
                    results.setdefault((stage, mode), []).append(median)
                    print(f"ZeRO-{stage} round {rnd} {mode:<9} median step {median * 1000:8.2f} ms", flush=True)
    print(f"\n{'stage':<8}{'off ms':>10}{'on ms':>10}{'on/off':>9}{'dslogger ms':>13}{'dslogger/off':>14}")
    for stage in stages:
        off, on, ds = (statistics.mean(results[(stage, m)]) for m in MODES)
        print(f"ZeRO-{stage:<3}{off * 1e3:>10.2f}{on * 1e3:>10.2f}{on / off:>9.3f}{ds * 1e3:>13.2f}{ds / off:>14.3f}")


if __name__ == "__main__":
    sys.exit(main())
