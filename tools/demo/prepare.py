"""`python -m tools.demo.prepare`: the demo's once-per-machine work, done before the cluster is up.

A first demo run on a fresh machine spends minutes before its first training step: DeepSpeed's
CPU communication op is compiled (into ~/.cache/torch_extensions, once per machine) and the
SmolLM2 GGUF file is converted to safetensors (once per cache folder). `scripts/demo.sh` runs
this module while the Kubernetes binaries are still building, so both overlap with that build;
the demo then copies the converted model into its output claim, where the trainer looks for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from finetune_localcluster.binaries import cache_dir

SMOLLM2 = "smollm2-135m-instruct"


def converted_models() -> Path:
    """The machine-wide folder of converted built-in models (outside the work tree)."""
    return cache_dir() / "builtin-models"


def compile_cpu_comm_op() -> None:
    """Build DeepSpeed's shared-memory CPU collective op exactly as the ranks will load it."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ShareMemCommBuilder().load(verbose=False)


def convert_smollm2(seed: int = 0) -> Path:
    from finetune_trainer.builtin import materialise_model

    return materialise_model(SMOLLM2, converted_models(), seed)


def seed_output_cache(output_dir: Path) -> bool:
    """Copy the converted SmolLM2 into a job's output cache; False when there is none to copy."""
    source = converted_models() / SMOLLM2
    if not source.is_dir():
        return False
    target = output_dir / ".cache" / SMOLLM2
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target)
    return True


def main() -> int:
    for name, work in (("DeepSpeed CPU comm op", compile_cpu_comm_op), ("SmolLM2 conversion", convert_smollm2)):
        started = time.monotonic()
        work()
        print(f"[demo prepare] {name}: ready in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
