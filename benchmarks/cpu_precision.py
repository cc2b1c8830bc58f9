"""bf16 against fp32 on this machine's CPU: one training step of the demo's tiny Llama, both dtypes.

Run on demand (never asserted):  .venv/bin/python benchmarks/cpu_precision.py [--steps 10]
Smallest run: `--smoke` (2 steps each).

torch computes bf16 matmuls natively only where the CPU has AVX-512 BF16 or AMX; elsewhere
(AVX2-only CPUs such as most AMD EPYC hosts) it converts, and a bf16 step costs several times
an fp32 one. The CPU examples (examples/*-cpu.yaml) train in fp32 for that reason, and the
tests pick bf16 only where bf16 is what they test. The two dtypes are measured alternately in
one process (CPU time of that process, one thread), so a noisy machine slows both alike.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="2 steps of each dtype")
    args = parser.parse_args(argv)
    steps = 2 if args.smoke else args.steps

    import torch
    from transformers import AutoModelForCausalLM

    from finetune_trainer.model.builtin_models import materialise_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    seconds = dict.fromkeys(dtypes, 0.0)
    with tempfile.TemporaryDirectory(prefix="ftjob-bench-") as tmp:
        path = materialise_model("tiny-llama", Path(tmp), 42)
        models = {k: AutoModelForCausalLM.from_pretrained(str(path), dtype=v) for k, v in dtypes.items()}
        batch = torch.randint(0, 100, (4, 64))
        for model in models.values():  # warm-up: first-call allocations and kernel selection
            model(input_ids=batch, labels=batch).loss.backward()
        for _ in range(steps):
            for name, model in models.items():
                started = time.process_time()
                model(input_ids=batch, labels=batch).loss.backward()
                seconds[name] += time.process_time() - started
    native = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    print(f"torch {torch.__version__}; CPU bf16 support: {', '.join(native) or 'none (converted)'}")
    print(f"{'dtype':6} {'steps':>5} {'CPU ms/step':>12}")
    for name in dtypes:
        print(f"{name:6} {steps:>5} {1000 * seconds[name] / steps:>12.1f}")
    print(f"bf16 / fp32: {seconds['bf16'] / seconds['fp32']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
