"""Memory and time of one AdamW step: torch's fused implementation against its two defaults, on CPU.

The trainer's client optimizer is torch's AdamW with `fused=True` (`rank_setup.build_engine`).
Without it torch picks by device: the multi-tensor ("foreach") step on CUDA, the single-tensor
one on the CPU. Both allocate temporaries the size of what they update, which the planner does
not count; the fused step allocates none. Each implementation runs in a fresh process: one fp32
parameter of `--millions` elements with a gradient, then the first step (it creates the two
Adam moments) and `--steps` more. The table gives how far each step raised the process's peak
resident memory beyond the parameter and its gradient, in MiB and as a multiple of the
parameter's size (the moments alone are 2.00), and the median time of the later steps, each
against the fused baseline. Run on demand; nothing here is asserted by the tests.

    .venv/bin/python benchmarks/optimizer_step_memory.py [--millions 100] [--steps 3]
    .venv/bin/python benchmarks/optimizer_step_memory.py --smoke     # 4 million elements
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

IMPLEMENTATIONS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "single-tensor": {"foreach": False}}
"""AdamW keyword arguments of each implementation; the first is the baseline."""
PROBE = """
import json, resource, sys, time, torch
n, steps, kwargs = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
param = torch.nn.Parameter(torch.zeros(n))
param.grad = torch.ones(n)
optimizer = torch.optim.AdamW([param], lr=1e-3, **kwargs)
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = peak()
optimizer.step()
times = []
for _ in range(steps):
    began = time.perf_counter()
    optimizer.step()
    times.append(time.perf_counter() - began)
print(json.dumps({"raised": peak() - before, "times": times}))
"""


def measure(millions: float, steps: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    elements = int(millions * 1e6)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(elements), str(steps), json.dumps(kwargs)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["param_bytes"] = elements * 4
    return result


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    base = results[next(iter(IMPLEMENTATIONS))]
    base_time = statistics.median(base["times"])
    lines = [f"{'implementation':<15}{'raised MiB':>12}{'x param':>9}{'step ms':>10}{'vs fused':>10}"]
    for name, result in results.items():
        step = statistics.median(result["times"])
        lines.append(
            f"{name:<15}{result['raised'] / 2**20:>12.0f}{result['raised'] / result['param_bytes']:>9.2f}"
            f"{step * 1000:>10.1f}{step / base_time:>9.2f}x"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--millions", type=float, default=100.0, help="parameter elements, in millions (default 100)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first (default 3)")
    parser.add_argument("--smoke", action="store_true", help="4 million elements, one timed step")
    args = parser.parse_args(argv)
    millions, steps = (4.0, 1) if args.smoke else (args.millions, args.steps)
    results = {name: measure(millions, steps, kwargs) for name, kwargs in IMPLEMENTATIONS.items()}
    print(f"one fp32 parameter of {millions:g} million elements ({millions * 4e6 / 2**20:.0f} MiB), CPU")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
