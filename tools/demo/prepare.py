"""`python -m tools.demo.prepare`: the demo's once-per-machine work, done before the cluster is up.

A first demo run on a fresh machine spends minutes before its first training step: DeepSpeed's
CPU communication op is compiled (into ~/.cache/torch_extensions; again for each checkout, since
the build file names the checkout's `.venv` paths and a changed build file rebuilds) and the
SmolLM2 GGUF file is converted to safetensors (once per cache folder). `scripts/demo.sh` runs
this module while the Kubernetes binaries are still building, so both overlap with that build;
the demo then copies the converted model into its output claim, where the trainer looks for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
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


STEPS: dict[str, tuple[str, Callable[[], object]]] = {
    "comm-op": ("DeepSpeed CPU comm op", compile_cpu_comm_op),
    "smollm2": ("SmolLM2 conversion", convert_smollm2),
}


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.demo.prepare [STEP ...]`: the named steps (comm-op, smollm2), or both."""
    chosen = (sys.argv[1:] if argv is None else argv) or list(STEPS)
    unknown = [step for step in chosen if step not in STEPS]
    if unknown:
        print(f"unknown step {', '.join(unknown)}: choose from {', '.join(STEPS)}", file=sys.stderr)
        return 2
    for name, work in (STEPS[step] for step in chosen):
        started = time.monotonic()
        work()
        print(f"[demo prepare] {name}: ready in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
