"""Communication bytes of one optimizer step: what the trainer reports vs the planner's model.

Runs the real pod entrypoint (`ftjob train`) on 2 CPU ranks (gloo) with the demo model
(builtin://tiny-llama, LoRA, fp32 because CPU computes in fp32) under ZeRO-2 and ZeRO-3,
with FTJOB_METRICS_STEP_LOG set so each rank writes its per-step collectives (the same
accounting that feeds `finetune_comm_*`). One steady-state step (the last of 5: at step 2
ZeRO-3 gathers about twice as much while it records its prefetch trace) is compared, op by
op, with `plan.comm.bytes_per_step`, whose numbers are bus bytes in nccl-tests' sense
("what one rank sends over the ring"). The model is given the run's true inputs, read from
the loaded model (4-byte gradients and parameters): the trainable count, the bytes ZeRO-3
gathers in every pass (parameters the forward uses, above
`stage3_param_persistence_threshold` elements) and the bytes of the persistent ones
(at most that many elements: whole on every rank, gathered once after each optimizer
step). peft's frozen copies of `modules_to_save` layers are never used in the forward, so
ZeRO-3 never gathers them; the table lists their bytes apart. A gap is thus the model's
shape, not its inputs.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/comm_bytes.py [--stages 2 3] [--keep DIR]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/comm_bytes.py --smoke   # ZeRO-3 only

A run that fails, or whose step log has no entry for the compared step, ends the benchmark
with exit status 1 and no table.
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

from finetune_operator.plan.search import comm  # noqa: E402

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
FP32 = 4
STEADY_STEP = 5  # the last step: ZeRO-3 re-gathers while it records its prefetch trace at step 2
TRAINABLE_LINE = re.compile(r"(\d+)/(\d+) trainable parameters")


@dataclass
class StageResult:
    stage: int
    trainable: int
    total: int
    gathered_bytes: int
    persistent_bytes: int
    unused_bytes: int
    persistence_threshold: float
    measured: dict[str, float] = field(default_factory=dict)  # bus bytes per op, mean over ranks
    measured_algorithm: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)

    def total_bus(self) -> float:
        return sum(self.measured.get(op, 0.0) for op in COLLECTIVES)


def demo_manifest(stage: int) -> dict[str, Any]:
    from tests.support.training_runs import job_manifest

    return job_manifest(
        "builtin://tiny-llama",
        "builtin://reverse-words",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 64, "validationSplit": 0.01},
        method={"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        training={"maxSteps": 5, "microBatchSize": 4, "globalBatchSize": 8, "precision": "fp32"},
        deepspeed={"zeroStage": stage},
    )


def parameter_bytes(config_dir: Path, threshold: float) -> tuple[int, int, int]:
    """(gathered, persistent, unused) parameter bytes of the run's model as ZeRO-3 sees it.

    Persistent: at most `threshold` elements (kept whole on every rank). Unused: peft's
    frozen originals of `modules_to_save` layers, which the forward never calls.
    """
    from finetune_trainer.model import modeling
    from finetune_trainer.settings import load_config

    cfg = load_config(config_dir)
    compute = modeling.compute_settings(cfg.job.spec, on_gpu=False)
    gathered = persistent = unused = 0
    with tempfile.TemporaryDirectory() as cache:
        path = modeling.model_path(cfg.job.spec.model.uri, Path(cache), cfg.job.spec.training.seed)
        model = modeling.load_model(cfg.job.spec, cfg.plan, path, compute)
        for name, p in model.named_parameters():
            size = p.numel() * FP32
            if ".original_module." in name:
                unused += size
            elif p.numel() <= threshold:
                persistent += size
            else:
                gathered += size
    return gathered, persistent, unused


def step_entries(step_log: Path, step: int) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in step_log.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["step"] == step]


def measure(stage: int, workdir: Path, timeout: float = 600) -> StageResult:
    from tests.support.training_runs import render_config, start_train

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
    gathered, persistent, unused = parameter_bytes(config, threshold)
    result = StageResult(stage, trainable, total, gathered, persistent, unused, threshold)
    entries = step_entries(step_log, STEADY_STEP)
    if not entries:
        raise RuntimeError(f"ZeRO-{stage}: the step log {step_log} has no entry for step {STEADY_STEP}")
    ranks = len(entries)
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
    result.model = comm.bytes_per_step(stage, 2, trainable, gathered, persistent_param_bytes=persistent, **common)
    return result


def table(results: list[StageResult]) -> str:
    lines = [f"{'stage':<7}{'op':<16}{'calls':>7}{'measured bus B':>16}{'model B':>14}{'ratio':>8}"]
    for r in results:
        for op in sorted({*COLLECTIVES, *r.measured}):
            got, want = r.measured.get(op, 0.0), r.model.get(op, 0)
            calls = r.counts.get(op, 0)
            lines.append(f"ZeRO-{r.stage:<2}{op:<16}{calls:>7.0f}{got:>16,.0f}{want:>14,}{_ratio(got, want):>8}")
        model_total = sum(r.model[op] for op in COLLECTIVES)
        lines.append(
            f"ZeRO-{r.stage:<2}{'TOTAL':<16}{'':>7}{r.total_bus():>16,.0f}{model_total:>14,}"
            f"{_ratio(r.total_bus(), model_total):>8}"
        )
        lines.append(
            f"        trainable {r.trainable:,} of {r.total:,} parameters; gathered per pass {r.gathered_bytes:,} B, "
            f"persistent {r.persistent_bytes:,} B (<= {r.persistence_threshold:g} elements), "
            f"unused modules_to_save originals {r.unused_bytes:,} B"
        )
    return "\n".join(lines)


def _ratio(got: float, want: float) -> str:
    return f"{got / want:.3f}" if want else ("-" if not got else "inf")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--keep", type=Path, default=None, help="work folder to keep (default: a temp folder)")
    parser.add_argument("--smoke", action="store_true", help="ZeRO-3 only (gathers, scatters and reduces)")
    args = parser.parse_args(argv)
    stages = [3] if args.smoke else args.stages
    with tempfile.TemporaryDirectory(prefix="comm-bytes-") as tmp:
        root = args.keep or Path(tmp)
        try:
            results = [measure(stage, root / f"zero{stage}") for stage in stages]
        except RuntimeError as exc:
            print(f"comm_bytes: measurement failed, no table: {exc}", file=sys.stderr)
            return 1
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
