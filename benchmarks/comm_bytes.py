"""Communication bytes of one optimizer step: what the trainer reports vs the planner's model.

Runs the real pod entrypoint (`ftjob train`) on 2 CPU ranks (gloo) with the demo model
(builtin://tiny-llama, LoRA, fp32 because CPU computes in fp32) under ZeRO-2 and ZeRO-3,
with FTJOB_METRICS_STEP_LOG set so each rank writes its per-step collectives (the same
accounting that feeds `finetune_comm_*`). One steady-state step (the last of 5: at step 2
ZeRO-3 gathers about twice as much while it records its prefetch trace) is compared, op by
op, with `plan.comm.bytes_per_step`, whose numbers are bus bytes in nccl-tests' sense
("what one rank sends over the ring"). The model is given the true parameter counts of the
run (from the trainer's start-up line) and 4-byte gradients and parameters, so a gap is the
model's shape, not its inputs. A second model column feeds ZeRO-3 only the bytes DeepSpeed
really gathers: parameters of at most `stage3_param_persistence_threshold` elements stay
resident on every rank and are never gathered.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/comm_bytes.py [--stages 2 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "operator", REPO / "trainer_image"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from finetune_operator.plan import comm  # noqa: E402

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
FP32 = 4
STEADY_STEP = 5  # the last step: ZeRO-3 re-gathers while it records its prefetch trace at step 2
TRAINABLE_LINE = re.compile(r"(\d+)/(\d+) trainable parameters")


@dataclass
class StageResult:
    stage: int
    trainable: int
    total: int
    persistent_bytes: int
    persistence_threshold: float
    measured: dict[str, float] = field(default_factory=dict)  # bus bytes per op, mean over ranks
    measured_algorithm: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)
    model_gathered_only: dict[str, int] = field(default_factory=dict)

    def total_bus(self) -> float:
        return sum(self.measured.get(op, 0.0) for op in COLLECTIVES)


def demo_manifest(stage: int) -> dict[str, Any]:
    from tests.trainer.conftest import job_manifest

    return job_manifest(
        "builtin://tiny-llama",
        "builtin://reverse-words",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.01},
        method={"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        training={"maxSteps": 5, "microBatchSize": 4, "globalBatchSize": 8, "precision": "fp32"},
        deepspeed={"zeroStage": stage},
    )


def persistent_bytes(config_dir: Path, threshold: float) -> int:
    """Bytes of the parameters ZeRO-3 keeps whole on every rank (numel <= threshold): never gathered."""
    from finetune_trainer import modeling
    from finetune_trainer.settings import load_config

    cfg = load_config(config_dir)
    compute = modeling.compute_settings(cfg.job.spec, on_gpu=False)
    with tempfile.TemporaryDirectory() as cache:
        path = modeling.model_path(cfg.job.spec.model.uri, Path(cache), cfg.job.spec.training.seed)
        model = modeling.load_model(cfg.job.spec, cfg.plan, path, compute)
        return sum(p.numel() * FP32 for p in model.parameters() if p.numel() <= threshold)


def step_entries(step_log: Path, step: int) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in step_log.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["step"] == step]


def measure(stage: int, workdir: Path, timeout: float = 600) -> StageResult:
    from tests.trainer.conftest import render_config, start_train

    workdir.mkdir(parents=True, exist_ok=True)
    config = render_config(workdir / "config", demo_manifest(stage))
    step_log = workdir / "steps.jsonl"
    run = start_train(config, workdir / "out", env={"FTJOB_METRICS_STEP_LOG": str(step_log)}, tag=f"zero{stage}")
    code = run.wait(timeout)
    if code != 0:
        raise RuntimeError(f"ZeRO-{stage} run failed ({code}):\n{run.log()[-3000:]}")
    found = TRAINABLE_LINE.search(run.log())
    if found is None:
        raise RuntimeError("no 'trainable parameters' line in the trainer log")
    trainable, total = int(found.group(1)), int(found.group(2))
    ds = json.loads((config / "deepspeed.json").read_text())
    threshold = float(ds["zero_optimization"].get("stage3_param_persistence_threshold", 1e5))
    result = StageResult(stage, trainable, total, persistent_bytes(config, threshold) if stage == 3 else 0, threshold)
    entries = step_entries(step_log, STEADY_STEP)
    ranks = max(1, len(entries))
    for entry in entries:
        for op, numbers in entry["comm"].items():
            result.measured[op] = result.measured.get(op, 0.0) + numbers["bus_bytes"] / ranks
            result.measured_algorithm[op] = result.measured_algorithm.get(op, 0.0) + numbers["bytes"] / ranks
            result.counts[op] = result.counts.get(op, 0.0) + numbers["count"] / ranks
    plan = json.loads((config / "plan.json").read_text())
    common: dict[str, Any] = {
        "grad_bytes": FP32,
        "accumulation_steps": int(plan["gradientAccumulationSteps"]),
        "gradient_checkpointing": bool(plan["gradientCheckpointing"]),
    }
    # the planner passes the gathered bytes (above the persistence threshold), as here
    result.model = comm.bytes_per_step(stage, 2, trainable, total * FP32 - result.persistent_bytes, **common)
    result.model_gathered_only = comm.bytes_per_step(
        stage, 2, trainable, total * FP32 - result.persistent_bytes, **common
    )
    return result


def table(results: list[StageResult]) -> str:
    lines = [
        f"{'stage':<7}{'op':<16}{'calls':>7}{'measured bus B':>16}{'model B':>14}{'ratio':>8}"
        f"{'model(gathered) B':>19}{'ratio':>8}"
    ]
    for r in results:
        ops = sorted({*COLLECTIVES, *r.measured})
        for op in ops:
            got, want, want2 = r.measured.get(op, 0.0), r.model.get(op, 0), r.model_gathered_only.get(op, 0)
            lines.append(
                f"ZeRO-{r.stage:<2}{op:<16}{r.counts.get(op, 0):>7.0f}{got:>16,.0f}{want:>14,}"
                f"{_ratio(got, want):>8}{want2:>19,}{_ratio(got, want2):>8}"
            )
        model_total = sum(r.model[op] for op in COLLECTIVES)
        gathered_total = sum(r.model_gathered_only[op] for op in COLLECTIVES)
        lines.append(
            f"ZeRO-{r.stage:<2}{'TOTAL':<16}{'':>7}{r.total_bus():>16,.0f}{model_total:>14,}"
            f"{_ratio(r.total_bus(), model_total):>8}{gathered_total:>19,}{_ratio(r.total_bus(), gathered_total):>8}"
        )
        lines.append(
            f"        trainable {r.trainable:,} of {r.total:,} parameters; persistent (never gathered) "
            f"{r.persistent_bytes:,} B (threshold {r.persistence_threshold:g} elements)"
        )
    return "\n".join(lines)


def _ratio(got: float, want: float) -> str:
    return f"{got / want:.3f}" if want else ("-" if not got else "inf")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--keep", type=Path, default=None, help="work folder to keep (default: a temp folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="comm-bytes-") as tmp:
        root = args.keep or Path(tmp)
        results = [measure(stage, root / f"zero{stage}") for stage in args.stages]
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
