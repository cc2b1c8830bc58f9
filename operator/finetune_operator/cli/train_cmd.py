"""`ftjob train --config DIR`: the entrypoint of every trainer pod.

Reads the rendered config directory and launches this node's DeepSpeed ranks (see
`finetune_trainer.launch`). torch and DeepSpeed are imported only when it runs.
"""

from __future__ import annotations

import argparse
import os

from ..api.pod_env import PodEnv
from ..render.config_files import CONFIG_DIR


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=os.environ.get(PodEnv.FTJOB_CONFIG_DIR, CONFIG_DIR),
        metavar="DIR",
        help="folder with job.json, plan.json, deepspeed.json and hostfile "
        f"(default $FTJOB_CONFIG_DIR or {CONFIG_DIR})",
    )


def run(args: argparse.Namespace) -> int:
    from finetune_trainer.launch import main

    return main(args.config)
