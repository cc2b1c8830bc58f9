"""`ftjob serve JOB [--target InferenceService|LLMInferenceService|Deployment]`: serve a job's result.

Sets the job's `spec.serving` (as a user would in the manifest); once the job succeeded the
operator applies the serving object, which outlives the job. `--wait` blocks until
`status.serving` names it and prints where to query; a target that cannot serve the result
exits 1 with the `Serving` condition's message (the field and what would work).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..api.serving import ServedModel, ServingTarget
from ..client import FineTuneClient
from ..client.views import parse_duration
from .cluster_args import EXIT_CODES_HELP, add_cluster_args, run_with_client


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("job", metavar="JOB", help="FineTuneJob name")
    parser.add_argument(
        "--target", default=ServingTarget.INFERENCE_SERVICE.value, choices=[t.value for t in ServingTarget],
        help="what serves it (default InferenceService; Deployment needs no KServe)",
    )  # fmt: skip
    parser.add_argument("--model", choices=[m.value for m in ServedModel], help="adapter, merged or auto (default)")
    parser.add_argument("--name", help="name of the served object (default: the job's)")
    parser.add_argument("--base-model-uri", help="where the runtime loads the base from (hf://org/name, pvc://, s3://)")
    parser.add_argument("--max-lora-rank", type=int, help="the runtime's largest LoRA rank (vLLM's, default 16)")
    parser.add_argument("--gpus", type=int, help="GPUs per serving replica (default 1)")
    parser.add_argument(
        "--wait", default="", metavar="DURATION", help="wait this long (10m, 90s) until it is applied; exit 124 after"
    )
    add_cluster_args(parser)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `spec.serving` fields the flags set (the rest keep their defaults)."""
    chosen = {
        "model": args.model,
        "name": args.name,
        "baseModelUri": args.base_model_uri,
        "maxLoraRank": args.max_lora_rank,
        "gpus": args.gpus,
    }
    return {key: value for key, value in chosen.items() if value is not None}


def run(args: argparse.Namespace) -> int:
    try:
        timeout = parse_duration(args.wait) if args.wait else None
    except ValueError as exc:
        print(f"ftjob serve: {exc}", file=sys.stderr)
        return 2

    def body(client: FineTuneClient) -> int:
        job = client.serve(args.job, args.target, timeout=timeout, **settings(args))
        serving = job.status.serving if job.status else None
        if serving is None:
            print(f"{job.name}: spec.serving set ({args.target}); the operator applies it once the job succeeded")
            return 0
        objects = ", ".join(f"{o.kind}/{o.name}" for o in serving.objects)
        print(f"{job.name}: {objects} serve{'s' if len(serving.objects) == 1 else ''} the {serving.served}")
        print(f"  model: {serving.model_name}")
        if serving.url:
            print(f"  url:   {serving.url}")
        return 0

    return run_with_client(args, body)
