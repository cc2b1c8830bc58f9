"""Chains of runs for the re-plan resume tests. A re-plan keeps the work: a LoRA/QLoRA run
resumes under every strategy the re-plan ladder can produce, and a full fine-tuning run across
ZeRO 2 <-> 3 and world size 2 <-> 1 (its DeepSpeed shards converted to a universal checkpoint).

Each test is a chain of runs over one output folder. Run k trains under strategy k, saves
a checkpoint every 3 steps and SIGKILLs all its ranks two steps after its last one (as an
out-of-memory kill would); run k+1 resumes from that checkpoint under strategy k+1. The
first step after the resume is the step the killed run had already logged: its loss
must be the same, which shows the restored adapter is what the forward pass uses. The
second step also depends on the restored Adam moments and LR schedule, so it must match
too, wherever the new strategy splits the global batch into the same micro-batches (a
changed micro-batch changes the mean of micro-batch means the gradient follows).

Tolerance: the runs compute in fp32 on the same weights and the same global batch of
samples; what differs is the order of reductions (ZeRO partitioning, a gather instead of
a local copy, padding widths of other micro-batches, a different count of ranks in the
all-reduce). Those are a few ulps of fp32 (~1e-7 relative) per operation through two
64-wide layers, so 1e-5 relative is loose enough for rounding and far below what a wrong
weight, a zeroed moment or a restarted LR warmup produce (1e-3 and more on this model).
The same bound holds for full fine-tuning: the universal checkpoint copies the fp32 masters
and Adam moments bit for bit, so only the reduction order differs there too.

bf16 (the GPU's precision, and DeepSpeed's 16-bit wrappers: ZeRO-0's `FP16_UnfusedOptimizer`,
ZeRO 1-3's fp32 partitions) needs another bound, 1e-4 relative. The fp32 masters and moments
still move bit for bit, but each weight and activation the forward pass reads is a bf16
rounding, 8 significant bits (a rounding is up to 2^-9 = 2e-3 of the value): the gradients
are summed in bf16 in another order, so after one step the masters of two strategies differ in
their last fp32 bits, and wherever that moves a weight across a bf16 rounding boundary its
bf16 copy differs by a whole bf16 step; ZeRO-3's linear layers (its own matmul) round other
elements than torch's linear. Measured (ZeRO-0 -> ZeRO-2, the step after the one the resume
repeats): 1.9e-4 on a loss of 6.0 (3.1e-5 relative); over the three bf16 chains at most 1.3e-4
on losses of 4 to 6.3, and half the compared steps agree exactly. The subtlest error the chain
must catch moves that step by ten times as much: an Adam step count off by one (ZeRO-0's 16-bit
wrappers count an extra all-zero step at build) by 1.8e-3 (3.0e-4 relative), zeroed moments by
9.1e-3, a restarted LR warm-up by 2.4e-2. 1e-4 lies between the two, a factor of three from each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.training_runs import METHODS, Run, job_manifest, render_config

CHECKPOINT_EVERY = 3
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-4}


@dataclass(frozen=True)
class Strategy:
    zero: int
    nodes: int = 2
    micro: int = 2
    offload_optimizer: str = "none"
    offload_params: str = "none"
    checkpointing: bool = False

    def __str__(self) -> str:
        checkpointing = ", checkpointing" if self.checkpointing else ""
        return f"{self.label()}, micro-batch {self.micro}, {self.nodes} node(s){checkpointing}"

    def label(self) -> str:
        parts = [f"ZeRO-{self.zero}"]
        if self.offload_optimizer != "none":
            parts.append(f"optimizer offload {self.offload_optimizer}")
        if self.offload_params != "none":
            parts.append(f"parameter offload {self.offload_params}")
        return ", ".join(parts)


def manifest(model: Path, data: Path, strategy: Strategy, steps: int, method: str, precision: str) -> dict[str, Any]:
    block = METHODS[method]
    return job_manifest(
        str(model),
        str(data),
        "/out",
        method=block,
        training={
            "precision": precision,
            "maxSteps": steps,
            "microBatchSize": strategy.micro,
            "globalBatchSize": 8,
            "checkpointEverySteps": CHECKPOINT_EVERY,
            "checkpointsToKeep": 1,
            "learningRate": 0.005,
            "warmupRatio": 0.3,
            "gradientCheckpointing": "true" if strategy.checkpointing else "false",
        },
        deepspeed={
            "zeroStage": strategy.zero,
            "offloadOptimizer": strategy.offload_optimizer,
            "offloadParams": strategy.offload_params,
        },
        resources={"numNodes": strategy.nodes, "gpusPerNode": 0},
    )


def _same_micro_batches(a: Strategy, b: Strategy) -> bool:
    return a.micro == b.micro


def run_chain(
    tmp_path: Path,
    model: Path,
    data: Path,
    launch: Callable[..., Run],
    method: str,
    chain: list[Strategy],
    precision: str = "fp32",
) -> list[tuple[str, int, float]]:
    """Runs the chain; returns (transition, step, |loss difference|) for every compared step."""
    steps = CHECKPOINT_EVERY * len(chain) + 2
    out = tmp_path / "out"
    measured: list[tuple[str, int, float]] = []
    previous: dict[int, float] = {}
    tolerance = TOLERANCE[precision]
    for k, strategy in enumerate(chain):
        config = render_config(tmp_path / f"config-{k}", manifest(model, data, strategy, steps, method, precision))
        last = k == len(chain) - 1
        kill_at = CHECKPOINT_EVERY * (k + 1) + 2
        env = {} if last else {"FTJOB_FAULT_KILL": f"step:{kill_at}"}
        run = launch(config, out, tag=f"run{k}", env=env)
        code = run.wait(300)
        log = run.log()
        if last:
            assert code == 0, log[-4000:]
        else:
            assert code != 0 and not (out / "COMPLETED.json").exists(), log[-4000:]
        assert f"{precision} on CPU" in log, log[-4000:]  # the job's precision, not a CPU fallback
        losses = run.losses()
        if k > 0:
            resumed_at = CHECKPOINT_EVERY * k
            before = chain[k - 1]
            assert f"resumed from step {resumed_at} written by {before.label()}" in log, log[-4000:]
            if method == "full" and (before.zero, before.nodes) != (strategy.zero, strategy.nodes):
                assert "DeepSpeed shards converted to the universal checkpoint" in log, log[-4000:]
            compared = [resumed_at + 1, resumed_at + 2] if _same_micro_batches(before, strategy) else [resumed_at + 1]
            for step in compared:
                difference = abs(losses[step] - previous[step])
                measured.append((f"{before} -> {strategy}", step, difference))
                print(f"{before} -> {strategy}: step {step} |loss difference| {difference:.3e}", flush=True)
                assert losses[step] == pytest.approx(previous[step], rel=tolerance, abs=tolerance), (
                    f"{before} -> {strategy}: step {step}"
                )
        assert max(losses) == (steps if last else kill_at)
        previous = losses
    return measured


CHAINS: dict[str, tuple[str, str, list[Strategy]]] = {
    # the ladder upwards, one rung at a time, ending with the smaller micro-batch rung; fp32 holds
    # the tightest bound, and its ZeRO-0 steps the model's own parameters (no 16-bit wrapper)
    "ladder": (
        "lora",
        "fp32",
        [
            Strategy(0),
            Strategy(1),
            Strategy(2),
            Strategy(3),
            Strategy(3, offload_optimizer="cpu"),
            Strategy(3, offload_optimizer="cpu", offload_params="cpu"),
            Strategy(3, offload_optimizer="cpu", offload_params="cpu", micro=1, checkpointing=True),
        ],
    ),
    # bf16, the GPU's precision: ZeRO-0's FP16_UnfusedOptimizer (fp32 masters beside the 16-bit
    # weights, which the portable state could not reach) to ZeRO-2 and on to ZeRO-3 + offload;
    # then downwards with the world size both ways, through ZeRO-1 with and without offload
    "bf16": (
        "lora",
        "bf16",
        [
            Strategy(0),
            Strategy(2),
            Strategy(3, offload_optimizer="cpu"),
            Strategy(2, nodes=1),
            Strategy(1, nodes=2, offload_optimizer="cpu"),
            Strategy(1, micro=1),
        ],
    ),
    # QLoRA: the 4-bit frozen base is reloaded; only the adapter state moves. Up the offload rung,
    # across ZeRO 3 -> 2 (compute-dtype -> uint8 storage of the 4-bit weights), world 2 -> 1, and
    # back across 2 -> 3 with world 1 -> 2. Only the first run evaluates before its first step,
    # and an evaluation must not change the 4-bit layers (`modeling.keep_4bit_training_layout`):
    # it repacked them, under ZeRO-3 into a forward of its own (fresh ZeRO-2 and ZeRO-3 step 1:
    # 6.2678 vs 6.2308 before, 6.267654 both after), and the resumed runs, which do not
    # evaluate first, computed another model (steps 4/5 off by 2.2e-5/1.5e-2 at ZeRO-2, by 7.1e-2 at ZeRO-3).
    "qlora": (
        "qlora",
        "bf16",
        [
            Strategy(3),
            Strategy(3, offload_optimizer="cpu"),
            Strategy(2, offload_optimizer="cpu"),
            Strategy(2, nodes=1),
            Strategy(3),
        ],
    ),
    # full fine-tuning in bf16 (the 16-bit weights in DeepSpeed's model states, the fp32 masters in its
    # optimizer shards): ZeRO 1 -> 3, then 3 -> 2 with world 2 -> 1, then world 1 -> 2 with ZeRO 2 -> 3
    # and optimizer offload
    "full": (
        "full",
        "bf16",
        [
            Strategy(1),
            Strategy(3),
            Strategy(2, nodes=1),
            Strategy(3, nodes=2, offload_optimizer="cpu"),
        ],
    ),
    # full fine-tuning up the offload rungs at ZeRO-3 in fp32: the same shards, read by DeepSpeed's own loader
    "full-offload": (
        "full",
        "fp32",
        [
            Strategy(3),
            Strategy(3, offload_optimizer="cpu"),
            Strategy(3, offload_optimizer="cpu", offload_params="cpu"),
            Strategy(3, offload_optimizer="cpu", offload_params="cpu", micro=1, checkpointing=True),
        ],
    ),
}


LADDER_CHAINS = ("ladder", "qlora")
"""The chains of test_replan_resume_ladder.py; test_replan_resume.py runs the others. Two files, so
that the trainer tier's two workers (which take whole files) each get about half (the five
chains and the conversion test ran 20 min on one worker, the last to end)."""
OTHER_CHAINS = tuple(name for name in CHAINS if name not in LADDER_CHAINS)


def check_chain(tmp_path: Path, model: Path, data: Path, launch: Callable[..., Run], chain: str) -> None:
    method, precision, strategies = CHAINS[chain]
    measured = run_chain(tmp_path, model, data, launch, method, strategies, precision)
    assert len(measured) >= len(strategies) - 1
