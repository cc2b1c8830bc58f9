"""`ftjob`: the command line of finetune-operator (also `kubectl ftjob`).

Each subcommand lives in its own module with `configure(parser)` and `run(args)`; the
module is imported only when its command runs, so `ftjob validate` stays torch-free
and fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("validate_cmd", "check FineTuneJob manifests (exit 1 with one line per problem)"),
    "plan": ("plan_cmd", "plan GPU memory and choose the ZeRO stage and offload that fit"),
    "render": ("render_cmd", "print every manifest the operator would create, as YAML"),
    "run": ("run_cmd", "run a job's training on this machine (CPU or GPU) with DeepSpeed"),
    "operator": ("operator_cmd", "run the operator (watches FineTuneJobs)"),
    "train": ("train_cmd", "the training entrypoint inside each pod"),
    "submit": ("submit_cmd", "create a FineTuneJob from a file; --wait for it, --follow its log"),
    "logs": ("logs_cmd", "print (-f: follow, across restarts) the trainer log of a job's rank"),
    "wait": ("wait_cmd", "wait until a job is Succeeded (or --for another state), with live progress"),
    "describe": ("describe_cmd", "a job's state, progress, ETA, plan vs measured memory, events and result"),
    "serve": ("serve_cmd", "serve a job's result (KServe InferenceService, LLMInferenceService or a vLLM Deployment)"),
    "inspect-model": ("inspect_cmd", "read a model's config.json and file sizes (the operator's inspector pod)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftjob",
        description="Plan, render and run distributed LLM fine-tuning (finetune.dev/v1alpha1 FineTuneJob).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _load(name: str) -> object | None:
    module_name, _ = COMMANDS[name]
    try:
        return importlib.import_module(f"finetune_operator.cli.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"finetune_operator.cli.{module_name}":
            return None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    top = build_parser()
    if not args or args[0] not in COMMANDS:
        top.parse_args(args)  # prints help or the "invalid choice" error and exits
        return 2
    name = args[0]
    module = _load(name)
    if module is None:
        print(f"ftjob {name}: not available in this build", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"ftjob {name}", description=COMMANDS[name][1])
    module.configure(parser)  # type: ignore[attr-defined]
    parsed = parser.parse_args(args[1:])
    try:
        result: int = module.run(parsed)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    raise SystemExit(main())
