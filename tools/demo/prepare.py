"""`python -m tools.demo.prepare`: the demo's once-per-machine work, done before the cluster is up.

A first demo run on a fresh machine would spend a minute before its first training step
converting the SmolLM2 GGUF file to safetensors (once per cache folder). `scripts/demo.sh` runs
this module while the Kubernetes binaries are still building, so the conversion overlaps with
that build; the demo then copies the converted model into its output claim, where the trainer
looks for it. (DeepSpeed's CPU comm op used to be compiled here too: the trainer no longer loads
it, see finetune_trainer.deepspeed_import.)
"""

from __future__ import annotations

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


def convert_smollm2(seed: int = 0) -> Path:
    from finetune_trainer.model.builtin_models import materialise_model

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
    "smollm2": ("SmolLM2 conversion", convert_smollm2),
}


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.demo.prepare [STEP ...]`: the named steps (smollm2), or all."""
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
