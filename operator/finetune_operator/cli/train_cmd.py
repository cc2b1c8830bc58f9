"""`ftjob train --config DIR`: the entrypoint of every trainer pod.

Reads the rendered config directory and launches this node's DeepSpeed ranks (see
`finetune_trainer.pod.launch`). It becomes `python -m finetune_trainer --config DIR` (same pid,
same exit status, the kubelet's signals reach the trainer itself; see `trainer_process`):
the operator never imports the trainer.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..api.pod_env import PodEnv
from ..render.config_files import CONFIG_DIR
from .trainer_process import MISSING_TRAINER_EXIT_CODE, exec_trainer, missing_trainer


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=os.environ.get(PodEnv.FTJOB_CONFIG_DIR, CONFIG_DIR),
        metavar="DIR",
        help="folder with job.json, plan.json, deepspeed.json and hostfile "
        f"(default $FTJOB_CONFIG_DIR or {CONFIG_DIR})",
    )


def run(args: argparse.Namespace) -> int:
    missing = missing_trainer("train")
    if missing:
        print(missing, file=sys.stderr)
        return MISSING_TRAINER_EXIT_CODE
    exec_trainer(["--config", str(args.config)])
