"""`ftjob plan FILE [--gpu-memory 80Gi] [--traced] [--json]`: the memory plan, offline.

Prints every candidate strategy with its per-GPU GiB by component and a one-line
verdict, or the JSON the operator's `status.plan` is derived from. Exits 1 when nothing
fits (with what would), 2 when the model cannot be planned at all.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..api.base import quantity_bytes
from ..api.methods import Objective
from ..plan import DoesNotFitError, PlanningError, plan_job
from ..plan.counting.activation_traits import activation_note
from ..plan.search.memory import BREAKDOWN_KEYS
from ..plan.search.planner import PlanResult
from .manifests import load_one

COLUMN_TITLES = {
    "weights": "weights",
    "trainable_weights": "train",
    "gradients": "grads",
    "optimizer_states": "optim",
    "activations": "activ",
    "logits": "logits",
    "buffers": "buffers",
    "overhead": "ovh",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a YAML file with one FineTuneJob ('-' for stdin)")
    parser.add_argument(
        "--gpu-memory", metavar="QUANTITY", help="plan for GPUs of this size (e.g. 80Gi) instead of the spec's"
    )
    parser.add_argument("--traced", action="store_true", help="measure activations by tracing a step (needs torch)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--all", action="store_true", help="list every candidate, not only the best of each strategy")


def _table(result: PlanResult, show_all: bool) -> str:
    gib = 2**30
    rows = result.candidates
    if not show_all:
        best: dict[tuple[int, str, str, bool], int] = {}
        for c in rows:
            key = (
                c.strategy.zero_stage,
                c.strategy.offload_optimizer,
                c.strategy.offload_params,
                c.strategy.gradient_checkpointing,
            )
            held = best.get(key)
            if held is None or (c.fits, -c.step.seconds) > (rows[held].fits, -rows[held].step.seconds):
                best[key] = c.index
        chosen_index = result.chosen.index if result.chosen else -1
        keep = set(best.values()) | {chosen_index}
        rows = [c for c in rows if c.index in keep]
    width = max([40, *(len(str(c.strategy)) + 2 for c in rows)])
    header = (
        f"  {'strategy':{width}}"
        + "".join(f"{COLUMN_TITLES[k]:>8}" for k in BREAKDOWN_KEYS)
        + f"{'total':>8}{'s/step':>9}  verdict"
    )
    lines = [header]
    for c in rows:
        mark = "*" if result.chosen is not None and c.index == result.chosen.index else " "
        cells = "".join(f"{c.memory.breakdown[k] / gib:8.1f}" for k in BREAKDOWN_KEYS)
        lines.append(
            f"{mark} {c.strategy!s:{width}}{cells}{c.per_gpu_bytes / gib:8.1f}{c.step.seconds:9.2f}  {c.reason}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    job = load_one(args.file)
    gpu_memory = quantity_bytes(args.gpu_memory) if args.gpu_memory else None
    try:
        result = plan_job(job.spec, gpu_memory_bytes=gpu_memory, traced=args.traced, require_fit=False)
    except PlanningError as exc:
        print(f"ftjob plan: {job.name}: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"ftjob plan: --traced needs torch, transformers and peft ({exc})", file=sys.stderr)
        return 2
    note = None if result.traced else activation_note(result.workload.shape)
    if args.json:
        print(json.dumps(result.to_json() | ({"notes": [note]} if note else {}), indent=2))
    else:
        w = result.workload
        method = str(w.method) if w.objective == Objective.SFT else f"{w.objective} on {w.method}"
        print(
            f"{job.name}: {w.source.name} ({w.counts.total / 1e9:.2f}B params, "
            f"{w.counts.trainable / 1e6:.1f}M trainable), "
            f"{method}, seq {w.seq_len}, global batch {w.global_batch}, {w.world_size} {w.device}(s); "
            f"GiB per {w.device}" + (" (activations traced)" if result.traced else "")
        )
        print(_table(result, args.all))
        print(result.verdict)
        if note:
            print(f"note: {note}")
    if result.chosen is None:
        print(str(DoesNotFitError(result.verdict, result.suggestions)), file=sys.stderr)
        return 1
    return 0
