"""The communication wrapper and the memory collector, in one process (no training run).

Bus factors follow nccl-tests; the wrapper counts each deepspeed.comm collective once
(whether called through the package or through comm.py's own helpers) and restores the
originals; label sets exist from start-up; GPU-only series carry help text but no samples
on CPU; the registry has prometheus-client's process_* series.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from finetune_localcluster.ports import free_port
from finetune_trainer.metrics import RankMetrics, new_registry
from finetune_trainer.metrics.comm import OPS, bus_factor

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(60)]

INFO = {"rank": "0", "local_rank": "0", "zero_stage": "2", "method": "lora", "UUID": ""}


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 4, 0.75), ("reduce_scatter", 2, 0.5),
     ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("all_to_all", 4, 0.75), ("all_reduce", 1, 0.0)],
)  # fmt: skip
def test_bus_factor_is_nccl_tests(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


@pytest.fixture(scope="module")
def single_rank_group() -> Iterator[None]:
    import torch.distributed as dist

    from finetune_trainer.deepspeed_import import import_deepspeed

    mp = pytest.MonkeyPatch()
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu"}.items():  # fmt: skip
        mp.setenv(key, value)
    deepspeed = import_deepspeed()  # without its CPU shm op, as the trainer's ranks
    deepspeed.init_distributed("gloo")
    yield
    dist.destroy_process_group()
    mp.undo()


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in exposition")


def test_comm_wrapper_counts_each_collective_once(single_rank_group: None) -> None:
    import deepspeed.comm as dist
    import deepspeed.comm.comm as comm_module
    import torch

    original = comm_module.all_gather_into_tensor
    registry = new_registry()
    metrics = RankMetrics(registry, INFO, on_gpu=False, planned={"weights": 10})
    try:
        text = generate_latest(registry).decode()
        for op in OPS:  # every op label exists from start-up
            assert f'finetune_comm_bus_bytes_total{{op="{op}"}} 0.0' in text
        before = metrics.comm.totals.snapshot()
        t = torch.ones(1000)
        dist.all_reduce(t)
        out = torch.empty(1000)
        dist.allgather_fn(out, t)  # helper in comm.py: reaches the wrapped leaf through module globals
        handle = dist.all_reduce(t, async_op=True)
        handle.wait()
        after = metrics.comm.totals.snapshot()
        assert after["all_reduce"].count - before["all_reduce"].count == 2
        assert after["all_gather"].count - before["all_gather"].count == 1
        assert after["all_gather"].bytes - before["all_gather"].bytes == 4000
        assert after["all_reduce"].seconds > before["all_reduce"].seconds
        text = generate_latest(registry).decode()
        assert _sample(text, 'finetune_comm_algorithm_bytes_total{op="all_reduce"}') == 8000
        assert _sample(text, 'finetune_comm_duration_seconds_count{op="all_reduce"}') == 2
    finally:
        metrics.close()
    assert comm_module.all_gather_into_tensor is original and dist.all_gather_into_tensor is original


def test_paused_accounting_lets_collectives_through_uncounted(single_rank_group: None) -> None:
    import deepspeed.comm as dist
    import torch

    metrics = RankMetrics(new_registry(), INFO, on_gpu=False, planned={"weights": 10})
    try:
        t = torch.ones(10)
        metrics.pause(True)
        metrics.step_started()
        dist.all_reduce(t)
        assert t.tolist() == [1.0] * 10  # the collective still ran (one rank: sum of one)
        metrics.step_done(step=1, epoch=0.0, loss=1.0, lr=1e-3, grad_norm=None, samples=1, tokens=1,
                          seconds=0.1, wait_seconds=0.0, model_params=10)  # fmt: skip
        assert metrics.comm.totals.by_op["all_reduce"].count == 0
        metrics.pause(False)
        dist.all_reduce(t)
        assert metrics.comm.totals.by_op["all_reduce"].count == 1
    finally:
        metrics.close()


def test_cpu_exposition_has_process_series_and_marks_gpu_only(single_rank_group: None) -> None:
    registry = new_registry()
    metrics = RankMetrics(registry, INFO, on_gpu=False, planned={"weights": 10, "gradients": 20}, comm=False)
    text = generate_latest(registry).decode()
    assert "process_resident_memory_bytes " in text and "process_cpu_seconds_total " in text
    assert "finetune_process_resident_memory_bytes" not in text
    assert 'finetune_planned_memory_bytes{component="gradients",rank="0"} 20.0' in text
    assert 'finetune_model_state_bytes{component="weights",device="cpu",rank="0",trainable="false"} 0.0' in text
    for name in (
        "finetune_gpu_memory_allocated_bytes",
        "finetune_activation_peak_bytes",
        "finetune_gpu_memory_ooms_total",
    ):
        help_line = next(line for line in text.splitlines() if line.startswith(f"# HELP {name} "))
        assert "GPU only" in help_line
        assert not [line for line in text.splitlines() if line.startswith(name) and not line.startswith("#")]
    metrics.close()


def test_model_state_counts_real_tensors_once(single_rank_group: None) -> None:
    import torch

    class Engine:
        def __init__(self) -> None:
            self.module = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 1))
            self.module[0].weight.requires_grad_(False)
            self.optimizer = torch.optim.AdamW([p for p in self.module.parameters() if p.requires_grad])

    engine = Engine()
    registry = new_registry()
    metrics = RankMetrics(registry, INFO, on_gpu=False, planned={}, comm=False)
    metrics.engine_ready(engine)
    loss = engine.module(torch.ones(2, 10)).sum()
    loss.backward()
    engine.optimizer.step()  # wrapped: gradients sampled before, states after
    states = metrics.memory.state_bytes()
    assert states["weights/cpu/false"] == 400
    assert states["weights/cpu/true"] == (10 + 10 + 1) * 4
    assert states["gradients/cpu/true"] == (10 + 10 + 1) * 4
    # Adam: exp_avg and exp_avg_sq per trainable tensor, plus a 4-byte step counter each.
    assert states["optimizer_states/cpu/true"] == 2 * (10 + 10 + 1) * 4 + 3 * 4
    metrics.close()


def test_zero0_16bit_model_state_counts_the_fp32_masters(single_rank_group: None) -> None:
    """A ZeRO-0 bf16 engine (DeepSpeed's `FP16_UnfusedOptimizer`) keeps an fp32 master of each
    16-bit trainable weight beside Adam's moments: the optimizer state counts it, as the plan does
    (the masters were missed: 180 bytes here instead of 264)."""
    import deepspeed
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 1))
    module[0].weight.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad])
    config = {"train_batch_size": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0},
              "steps_per_print": 1_000_000}  # fmt: skip
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    assert type(engine.optimizer).__name__ == "FP16_UnfusedOptimizer"
    metrics = RankMetrics(new_registry(), INFO, on_gpu=False, planned={}, comm=False)
    metrics.engine_ready(engine)
    engine.backward(engine(torch.ones(2, 10, dtype=torch.bfloat16)).float().sum())
    engine.step()
    states = metrics.memory.state_bytes()
    trainable = 10 + 10 + 1
    assert states["weights/cpu/true"] == 2 * trainable
    assert states["gradients/cpu/true"] == 2 * trainable  # the bf16 gradients, before the step
    # the fp32 masters, Adam's two fp32 moments, and a 4-byte step counter per trainable tensor
    assert states["optimizer_states/cpu/true"] == 4 * trainable + 2 * 4 * trainable + 3 * 4
    metrics.close()
