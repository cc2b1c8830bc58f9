"""`ftjob describe JOB`: a job at a glance: state, progress and ETA, the plan's memory beside
what rank 0 measured, restarts and the last failure, the last events, the result."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..api import FineTuneJob
from ..client import FineTuneClient, JobEvent, MetricsUnavailable
from ..client.views import format_duration, progress_line, state_of
from .cluster_args import EXIT_CODES_HELP, add_cluster_args, run_with_client

MEMORY_COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "logits", "buffers", "overhead")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("job", metavar="JOB", help="FineTuneJob name")
    parser.add_argument("--events", type=int, default=10, metavar="N", help="how many of the last events (default 10)")
    add_cluster_args(parser)


def run(args: argparse.Namespace) -> int:
    def body(client: FineTuneClient) -> int:
        job = client.get(args.job)
        measured: dict[str, float] | str | None = None
        if state_of(job) in ("Running", "Restarting"):
            try:
                measured = client.measured_memory(job.name)
            except MetricsUnavailable as exc:
                measured = str(exc)
        print(describe(job, client.events(job.name), measured, args.events))
        return 0

    return run_with_client(args, body)


def _gib(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def describe(
    job: FineTuneJob, events: Sequence[JobEvent], measured: dict[str, float] | str | None, last: int = 10
) -> str:
    """The text of `ftjob describe` (pure: the caller fetches job, events and metrics; `measured` is
    rank 0's reading, or why there is none)."""
    spec, status = job.spec, job.status
    res = spec.resources
    where = f"{res.num_nodes} pod(s) x {res.ranks_per_node} rank(s)" + (
        f", {res.gpus_per_node} GPU(s) of {res.gpu_memory} each" if res.gpus_per_node else " on CPU"
    )
    lines = [
        f"Name:        {job.name}",
        f"Namespace:   {job.namespace}",
        f"Job:         {spec.method.type} on {spec.model.uri}, {where}",
        f"State:       {state_of(job)}",
    ]
    if status is None:
        return "\n".join([*lines, "Status:      none yet (is the operator running?)"])
    for condition in status.conditions:
        if condition.status == "True":
            message = f": {condition.message}" if condition.message else ""
            lines.append(f"  {condition.type} ({condition.reason}){message}"[:300])
    if status.workers is not None:
        lines.append(f"Workers:     {status.workers.ready}/{status.workers.total} ready")
    if status.progress is not None:
        line = progress_line(job).removeprefix(f"{job.name} {state_of(job)} ")
        lines.append(f"Progress:    {line}")
        eta = status.progress.eta_seconds
        if eta is not None and state_of(job) not in ("Succeeded", "Failed"):
            lines.append(f"ETA:         {format_duration(eta)}")
    lines.append(f"Restarts:    {status.restarts} (preemptions {status.preemptions})")
    if status.last_failure is not None:
        failure = status.last_failure
        rank = f" rank {failure.rank}" if failure.rank is not None else ""
        code = f" exit {failure.exit_code}" if failure.exit_code is not None else ""
        lines.append(f"Last failure:{rank}{code} {failure.reason}: {failure.message}"[:300])
    lines.extend(_memory(job, measured))
    result = status.result
    if result is not None and state_of(job) == "Succeeded":
        lines.append("Result:")
        for label, uri in (("adapter", result.adapter_uri), ("model", result.model_uri),
                           ("merged", result.merged_model_uri)):  # fmt: skip
            if uri:
                lines.append(f"  {label:<11} {uri}")
        if result.final_loss is not None:
            lines.append(f"  final loss  {result.final_loss:.4f}")
        if result.eval_loss is not None:
            before = f"{result.eval_loss_before:.4f} -> " if result.eval_loss_before is not None else ""
            lines.append(f"  eval loss   {before}{result.eval_loss:.4f}")
        if result.exact_match is not None:
            before = f"{result.exact_match_before:.1%} -> " if result.exact_match_before is not None else ""
            lines.append(f"  exact match {before}{result.exact_match:.1%}")
        if result.steps is not None:
            wall = f" in {format_duration(result.wall_seconds)}" if result.wall_seconds is not None else ""
            lines.append(f"  steps       {result.steps}, {result.tokens or 0:,} tokens{wall}")
    lines.extend(_serving(job))
    lines.append(f"Events (last {min(last, len(events))} of {len(events)}):")
    for event in events[-last:] if last > 0 else []:
        count = f" (x{event.count})" if event.count > 1 else ""
        lines.append(f"  {event.last_time}  {event.type:<7} {event.reason}{count}: {event.message}"[:300])
    return "\n".join(lines)


def _serving(job: FineTuneJob) -> list[str]:
    """What serves the result (`status.serving`), or why nothing does (the Serving condition)."""
    status = job.status
    condition = next((c for c in status.conditions if c.type == "Serving"), None) if status else None
    if job.spec.serving is None or status is None:
        return []
    lines = [f"Serving:     {job.spec.serving.target}"]
    if status.serving is not None:
        objects = ", ".join(f"{o.kind}/{o.name}" for o in status.serving.objects)
        lines.append(f"  {objects}: the {status.serving.served} as {status.serving.model_name!r}")
        if status.serving.url:
            lines.append(f"  url         {status.serving.url}")
    if condition is not None and condition.status != "True":
        lines.append(f"  {condition.reason}: {condition.message}")
    elif condition is None:
        lines.append("  applied once the job succeeded")
    return lines


def _memory(job: FineTuneJob, reading: dict[str, float] | str | None) -> list[str]:
    plan = job.status.plan if job.status else None
    if plan is None:
        return []
    measured = reading if isinstance(reading, dict) else None
    lines = [
        f"Plan:        ZeRO-{plan.zero_stage}, offload optimizer {plan.offload_optimizer} / params "
        f"{plan.offload_params}, micro-batch {plan.micro_batch_size} x accumulation "
        f"{plan.gradient_accumulation_steps}, checkpointing {'on' if plan.gradient_checkpointing else 'off'}",
        "Memory per rank (plan vs measured on rank 0):",
        f"  {'component':<17} {'planned':>12} {'measured':>12}",
    ]
    breakdown = plan.breakdown.model_dump()
    for component in MEMORY_COMPONENTS:
        planned = breakdown.get(component)
        got = measured.get(component) if measured else None
        if planned or got:
            lines.append(f"  {component:<17} {_gib(planned):>12} {_gib(got):>12}")
    peak = _gib(measured.get("gpu_peak")) if measured else "-"
    lines.append(f"  {'total':<17} {_gib(plan.per_gpu_bytes):>12} {peak:>12}")
    if measured and "resident" in measured:
        lines.append(f"  rank 0 process resident memory: {_gib(measured['resident'])}")
    elif isinstance(reading, str):
        lines.append(f"  (nothing measured: {reading})")
    return lines
