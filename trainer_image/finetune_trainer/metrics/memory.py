"""Memory metrics of one rank: model state from the real tensors, allocator statistics, the plan.

Model state is counted from the tensors the engine holds, not from a formula, so it can be
set against the planner's prediction (`finetune_planned_memory_bytes`, from plan.json):

- weights: every module parameter; under ZeRO-3 the local partition `ds_tensor` (plus the
  full data of parameters that are gathered or persistent when sampled);
- gradients: the ZeRO optimizer's gradient partitions (or `param.grad` without ZeRO),
  sampled just before the optimizer step, when they are all alive;
- optimizer_states: the inner optimizer's state (Adam moments) and the fp32 masters, wherever
  they live: ZeRO 1-3's partitions (CPU under optimizer offload), ZeRO-0's per-parameter or
  flat fp32 copies of a 16-bit run.

Views of one flat buffer are counted once (distinct (address, size) pairs). Sampling wraps
the ZeRO optimizer's `step` (gradients before, weights and states after) so the training
loop needs no extra call. Walking the tensors' metadata never synchronises a device but
costs a few microseconds per tensor (about 2 ms for a model of a few hundred tensors with
per-parameter Adam states on a busy CPU), so after the first two steps it is done at most
every `min_interval_s` seconds: these numbers move only when the engine reallocates.

Allocator series (`finetune_gpu_memory_*`, `finetune_activation_peak_bytes`) exist only on
GPU: they are registered everywhere so their help text is visible, but carry samples only when
torch.cuda is in use. On CPU the process's `process_resident_memory_bytes` (ProcessCollector)
is what there is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

COMPONENTS = ("weights", "gradients", "optimizer_states")
GPU_ONLY = " GPU only: no samples on CPU runs."
ALLOCATOR_GAUGES = {
    "allocated": ("allocated_bytes.all.current", "Bytes held by tensors (PyTorch caching allocator)."),
    "reserved": ("reserved_bytes.all.current", "Bytes reserved by the caching allocator."),
    "allocated_peak": ("allocated_bytes.all.peak", "Peak allocated bytes during the last step."),
    "reserved_peak": ("reserved_bytes.all.peak", "Peak reserved bytes during the last step."),
}
GRAD_ATTRS = ("grads_in_partition", "grad_partitions_flat_buffer")
GRAD_DICT_ATTRS = (
    "averaged_gradients",
    "accumulated_grads_in_cpu",
    "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
)
MASTER_ATTRS = (
    "single_partition_of_fp32_groups",  # ZeRO 1-2
    "fp32_partitioned_groups_flat",  # ZeRO-3
    "fp32_groups_flat_partition",  # BF16_Optimizer
    "fp32_groups",  # ZeRO-0 16-bit: FP16_UnfusedOptimizer
    "fp32_groups_flat",  # ZeRO-0 16-bit over a fused Adam: FP16_Optimizer
)


def _device(tensor: Any) -> str:
    return "cpu" if tensor.device.type == "cpu" else "gpu"


def _tensors(value: Any) -> Iterator[Any]:
    """Tensors inside a tensor, list, tuple or dict (one level of nesting each)."""
    if value is None:
        return
    if hasattr(value, "untyped_storage"):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


class _Tally:
    """Bytes by (component, device, trainable), each (address, nbytes) counted once."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.bytes: dict[tuple[str, str, str], int] = {}

    def add(self, component: str, tensors: Iterable[Any], trainable: bool = True) -> None:
        for t in tensors:
            nbytes = int(t.numel() * t.element_size())
            if nbytes == 0:
                continue
            key = (int(t.data_ptr()), nbytes)
            if key in self.seen:
                continue
            self.seen.add(key)
            label = (component, _device(t), "true" if trainable else "false")
            self.bytes[label] = self.bytes.get(label, 0) + nbytes


def weight_tensors(module: Any) -> Iterator[tuple[Any, bool]]:
    for param in module.parameters():
        partition = getattr(param, "ds_tensor", None)
        if partition is not None:
            yield partition, bool(param.requires_grad)
        yield param.data, bool(param.requires_grad)


def gradient_tensors(engine: Any) -> Iterator[Any]:
    optimizer = engine.optimizer
    found = False
    for name in GRAD_ATTRS + GRAD_DICT_ATTRS:
        for t in _tensors(getattr(optimizer, name, None)):
            found = True
            yield t
    for name in MASTER_ATTRS:
        for master in _tensors(getattr(optimizer, name, None)):
            if master.grad is not None:
                found = True
                yield master.grad
    if not found:  # no ZeRO partitioning of gradients: they live on the parameters
        for param in engine.module.parameters():
            if param.grad is not None:
                yield param.grad


def optimizer_state_tensors(engine: Any) -> Iterator[Any]:
    optimizer = engine.optimizer
    for name in MASTER_ATTRS:
        yield from _tensors(getattr(optimizer, name, None))
    inner = getattr(optimizer, "optimizer", optimizer)
    for state in getattr(inner, "state", {}).values():
        yield from _tensors(state)


class MemoryMetrics(Collector):
    """Model-state, planned and (GPU) allocator series of one rank."""

    paused = False  # the overhead benchmark's "off" steps
    min_interval_s = 5.0  # model state changes after the first steps only with offload or re-plans

    def __init__(self, registry: CollectorRegistry, rank: int, on_gpu: bool, planned: dict[str, int]) -> None:
        self.rank = str(rank)
        self.on_gpu = on_gpu
        self.model_state = Gauge(
            "finetune_model_state_bytes",
            "Bytes of the model state this rank holds, summed over the real tensors (ZeRO-3: the local "
            "partitions ds_tensor); device=cpu for offloaded states. Exists on CPU and GPU.",
            ["rank", "component", "device", "trainable"],
            registry=registry,
        )
        for device in ("gpu", "cpu") if on_gpu else ("cpu",):
            for component in COMPONENTS:
                for trainable in ("true", "false") if component == "weights" else ("true",):
                    self.model_state.labels(self.rank, component, device, trainable).set(0)
        self.planned = Gauge(
            "finetune_planned_memory_bytes",
            "Bytes per GPU the planner predicted for this component (status.plan.breakdown in plan.json).",
            ["rank", "component"],
            registry=registry,
        )
        for component, value in planned.items():
            self.planned.labels(self.rank, component).set(value)
        self._stats: dict[str, float] = {}
        self._total = 0.0
        self._before_forward = 0.0
        self._activation_peak: float | None = None
        self._states: dict[tuple[str, str, str], int] = {}
        self._steps_seen = 0
        self._sampled_at = 0.0
        registry.register(self)

    # ---- model state --------------------------------------------------------------------------
    def watch(self, engine: Any) -> None:
        """Sample the model state around every optimizer step of this engine, and once now."""
        optimizer = engine.optimizer
        step = getattr(optimizer, "step", None)
        if step is None or getattr(step, "_finetune_sampled", False):
            self.sample(engine)
            return

        def sampled_step(*args: Any, **kwargs: Any) -> Any:
            if self.paused:
                return step(*args, **kwargs)
            self._steps_seen += 1
            due = self._steps_seen <= 2 or time.monotonic() - self._sampled_at >= self.min_interval_s
            if not due:
                return step(*args, **kwargs)
            gradients = _Tally()
            gradients.add("gradients", gradient_tensors(engine))
            result = step(*args, **kwargs)
            self.sample(engine, gradients.bytes)
            return result

        sampled_step._finetune_sampled = True  # type: ignore[attr-defined]
        optimizer.step = sampled_step
        initial = _Tally()
        initial.add("gradients", gradient_tensors(engine))
        self.sample(engine, initial.bytes)

    def sample(self, engine: Any, gradients: dict[tuple[str, str, str], int] | None = None) -> None:
        """Set weights and optimizer states from the engine now, and gradients if given."""
        tally = _Tally()
        for tensor, trainable in weight_tensors(engine.module):
            tally.add("weights", (tensor,), trainable)
        tally.add("optimizer_states", optimizer_state_tensors(engine))
        values = dict(tally.bytes)
        components = {"weights", "optimizer_states"}
        if gradients is not None:
            values.update(gradients)
            components.add("gradients")
        for labels in set(self._states) | set(values):
            if labels[0] in components:
                self.model_state.labels(self.rank, *labels).set(values.get(labels, 0))
                self._states[labels] = values.get(labels, 0)
        self._sampled_at = time.monotonic()

    def state_bytes(self) -> dict[str, int]:
        """The last sample as `component/device/trainable` -> bytes (for the step log)."""
        return {"/".join(labels): value for labels, value in sorted(self._states.items())}

    # ---- allocator (GPU) ------------------------------------------------------------------------
    def step_started(self) -> None:
        if not self.on_gpu:
            return
        import torch

        torch.cuda.reset_peak_memory_stats()
        self._before_forward = float(torch.cuda.memory_allocated())

    def step_done(self) -> None:
        if not self.on_gpu:
            return
        import torch

        stats = torch.cuda.memory_stats()
        self._stats = {k: float(v) for k, v in stats.items() if isinstance(v, int | float)}
        if not self._total:
            self._total = float(torch.cuda.mem_get_info()[1])
        self._activation_peak = max(0.0, self._stats.get("allocated_bytes.all.peak", 0.0) - self._before_forward)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["rank"]
        stats = self._stats
        for suffix, (key, help_text) in ALLOCATOR_GAUGES.items():
            family = GaugeMetricFamily(f"finetune_gpu_memory_{suffix}_bytes", help_text + GPU_ONLY, labels=labels)
            if stats:
                family.add_metric([self.rank], stats.get(key, 0.0))
            yield family
        total = GaugeMetricFamily(
            "finetune_gpu_memory_total_bytes", "Device memory (mem_get_info)." + GPU_ONLY, labels=labels
        )
        if self._total:
            total.add_metric([self.rank], self._total)
        yield total
        for name, key, help_text in (
            ("finetune_gpu_memory_alloc_retries", "num_alloc_retries", "cudaMalloc retries after freeing the cache."),
            ("finetune_gpu_memory_ooms", "num_ooms", "Out-of-memory errors the allocator raised."),
        ):
            counter = CounterMetricFamily(name, help_text + GPU_ONLY, labels=labels)
            if stats:
                counter.add_metric([self.rank], stats.get(key, 0.0))
            yield counter
        activation = GaugeMetricFamily(
            "finetune_activation_peak_bytes",
            "Peak allocated bytes of the last step minus those allocated before its forward pass." + GPU_ONLY,
            labels=labels,
        )
        if self._activation_peak is not None:
            activation.add_metric([self.rank], self._activation_peak)
        yield activation
