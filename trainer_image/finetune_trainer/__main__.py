"""`python -m finetune_trainer`: the pod entrypoint as a program, the way the operator's CLI reaches it.

The operator never imports the trainer (an import-linter contract holds it), so `ftjob train`
and `ftjob run` start this module instead (`finetune_operator.cli.trainer_process`):

    python -m finetune_trainer --config DIR
        `ftjob train`, the pod's main process: `launch.main` (the summary on stdout, or the
        failure line on stderr; idles when the job already completed; exits with its code).
    python -m finetune_trainer --config DIR --result FILE [--progress]
        `ftjob run`: `launch.train` without idling, its result written to FILE as JSON
        ({"exitCode", "summary", "message"}; `summary` is the TrainingSummary's wire form or
        null) for `ftjob run` to report; nothing printed of its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from finetune_trainer.atomic_json import write_json_atomic
from finetune_trainer.pod import launch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_trainer", description="the pod entrypoint")
    parser.add_argument("--config", required=True, metavar="DIR", help="the rendered config folder")
    parser.add_argument("--result", metavar="FILE", help="write the result here as JSON (a local run: never idles)")
    parser.add_argument("--progress", action="store_true", help="a progress bar (with --result)")
    args = parser.parse_args(argv)
    if args.result is None:
        if args.progress:
            parser.error("--progress is a local run's: use it with --result")
        return launch.main(args.config)
    result = launch.train(args.config, progress=args.progress, idle_when_done=False)
    record = {"exitCode": result.exit_code, "summary": result.summary, "message": result.message}
    write_json_atomic(Path(args.result), record)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
