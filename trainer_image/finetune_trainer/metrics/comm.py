"""Per-collective communication metrics of one rank, from our own timing of `deepspeed.comm`.

Why our own wrapper and not DeepSpeed's comms logger (both were measured, see
benchmarks/metrics_overhead.py and the closing note of issue 7):

- correctness: the logger keeps running totals of latency per op name (deltas needed), uses
  the global world size for sub-groups, counts all-reduce algorithm bytes as 2S and multiplies
  the all-gather message by n a second time; on CPU it times only the enqueue of async ops
  (its device synchronise is a no-op) and on GPU it synchronises after *every* collective,
  which serialises the overlap ZeRO relies on. Its store grows without bound.
- cost: it binds the call signature of every collective (`inspect.Signature.bind_partial`)
  and appends floats to unbounded lists; we do a few attribute lookups, two clock reads and
  four metric updates per call, and never synchronise.

How: the leaf functions of `deepspeed.comm` (the ones that call the backend) are replaced,
both on the package and on `deepspeed.comm.comm` (its own helpers such as `allgather_fn` and
`reduce_scatter_fn` call the leaves through that module's globals), so each collective is
counted exactly once however ZeRO reaches it. Sizes follow nccl-tests: S is the full buffer
(all-gather output, reduce-scatter input), algorithm bytes = S, bus bytes = S·factor with
all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n, broadcast and reduce 1,
n the size of the group the call used. Durations are *exposed* time, what the
"share of step time in collectives" panel needs: a synchronous call is timed around the call,
an async one is its issue plus the time its handle's `wait()` blocks (timing async calls from
issue to completion was tried first: ZeRO-3's prefetched all-gathers overlap one another and
summed to 8x the step time). On GPU the clock is CUDA events on the issuing stream around the
call (or the wait), read at the end of the step once completed: no added synchronisation.
Code that imports a collective by name before installation (DeepSpeed's quantized
all-to-all) is not seen; barriers carry no data and are not counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
DURATION_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 30)
SIZE_BUCKETS = tuple(float(1 << b) for b in range(10, 34, 2))  # 1 KiB .. 8 GiB, powers of 4


@dataclass(frozen=True)
class Leaf:
    """One backend-calling function of deepspeed.comm: its op label and where its arguments are."""

    op: str
    size_arg: int  # positional index of the tensor (or list) that holds S
    size_kw: str
    group_arg: int
    async_arg: int


LEAVES: dict[str, Leaf] = {
    "all_reduce": Leaf("all_reduce", 0, "tensor", 2, 3),
    "inference_all_reduce": Leaf("all_reduce", 0, "tensor", 2, 3),
    "all_reduce_coalesced": Leaf("all_reduce", 0, "tensors", 2, 3),
    "all_gather_into_tensor": Leaf("all_gather", 0, "output_tensor", 2, 3),
    "all_gather": Leaf("all_gather", 0, "tensor_list", 2, 3),
    "reduce_scatter_tensor": Leaf("reduce_scatter", 1, "tensor", 3, 4),
    "reduce_scatter": Leaf("reduce_scatter", 1, "input_list", 3, 4),
    "broadcast": Leaf("broadcast", 0, "tensor", 2, 3),
    "reduce": Leaf("reduce", 0, "tensor", 3, 4),
    "all_to_all_single": Leaf("all_to_all", 1, "tensor", 4, 5),
}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busBw / algBw for a group of n ranks."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _nbytes(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    numel = getattr(value, "numel", None)
    return int(numel() * value.element_size()) if numel is not None else 0


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


@dataclass
class OpTotals:
    count: int = 0
    bytes: float = 0.0
    bus_bytes: float = 0.0
    seconds: float = 0.0


@dataclass
class _Pending:
    """A GPU-timed call whose events are read at the end of the step."""

    op: str
    start: Any
    end: Any


@dataclass
class CommTotals:
    """Running totals by op, for per-step deltas (the step log and the comm-bytes benchmark)."""

    by_op: dict[str, OpTotals] = field(default_factory=lambda: {op: OpTotals() for op in OPS})

    def snapshot(self) -> dict[str, OpTotals]:
        return {op: OpTotals(t.count, t.bytes, t.bus_bytes, t.seconds) for op, t in self.by_op.items()}


class _TimedWork:
    """An async handle: the time its `wait()` blocks is added to the collective's exposed time."""

    def __init__(self, work: Any, waited: Callable[[Callable[[], Any]], None]) -> None:
        self._work = work
        self._waited: Callable[[Callable[[], Any]], None] | None = waited

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self._waited is None:
            return self._work.wait(*args, **kwargs)
        waited, self._waited = self._waited, None
        box: list[Any] = []
        waited(lambda: box.append(self._work.wait(*args, **kwargs)))
        return box[0] if box else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CommMetrics:
    """The `finetune_comm_*` series, fed by wrappers installed around deepspeed.comm."""

    def __init__(self, registry: CollectorRegistry, on_gpu: bool = False) -> None:
        self.on_gpu = on_gpu
        self.duration = Histogram(
            "finetune_comm_duration_seconds",
            "Exposed time per collective issued through deepspeed.comm: the issuing thread (CPU) or stream (GPU) "
            "blocked on it; for async calls the issue plus the wait(), so overlapped transfer is not counted.",
            ["op"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.size = Histogram(
            "finetune_comm_message_size_bytes",
            "Buffer size S per collective as nccl-tests defines it (all-gather output, reduce-scatter input).",
            ["op"],
            buckets=SIZE_BUCKETS,
            registry=registry,
        )
        self.algorithm_bytes = Counter(
            "finetune_comm_algorithm_bytes",
            "Algorithm bytes S of the collectives (nccl-tests algbw numerator).",
            ["op"],
            registry=registry,
        )
        self.bus_bytes = Counter(
            "finetune_comm_bus_bytes",
            "Bus bytes: S x 2(n-1)/n for all-reduce, S x (n-1)/n for all-gather, reduce-scatter and all-to-all, "
            "S for broadcast and reduce; n = ranks in the call's group (nccl-tests busbw numerator).",
            ["op"],
            registry=registry,
        )
        self._children = {
            op: (
                self.duration.labels(op),
                self.size.labels(op),
                self.algorithm_bytes.labels(op),
                self.bus_bytes.labels(op),
            )
            for op in OPS
        }
        self.totals = CommTotals()
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()
        self._group_sizes: dict[int, int] = {}
        self._installed: list[tuple[Any, str, Any]] = []
        self.paused = False  # the overhead benchmark's "off" steps: the wrapper passes calls straight through

    # ---- installation -----------------------------------------------------------------------
    def install(self) -> None:
        """Wrap the leaf collectives of deepspeed.comm (idempotent per instance)."""
        import deepspeed.comm as package
        import deepspeed.comm.comm as module

        if self._installed:
            return
        for name, leaf in LEAVES.items():
            original = getattr(module, name, None)
            if original is None:
                continue
            wrapped = self._wrap(original, leaf)
            for target in (package, module):
                if getattr(target, name, None) is original:
                    self._installed.append((target, name, original))
                    setattr(target, name, wrapped)

    def uninstall(self) -> None:
        for target, name, original in reversed(self._installed):
            setattr(target, name, original)
        self._installed.clear()

    # ---- accounting -------------------------------------------------------------------------
    def _group_size(self, group: Any) -> int:
        key = id(group)
        size = self._group_sizes.get(key)
        if size is None:
            import torch.distributed as dist

            size = int(dist.get_world_size(group)) if dist.is_initialized() else 1
            self._group_sizes[key] = size
        return size

    def _wrap(self, original: Callable[..., Any], leaf: Leaf) -> Callable[..., Any]:
        op = leaf.op

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.paused:
                return original(*args, **kwargs)
            size = _nbytes(_arg(args, kwargs, leaf.size_arg, leaf.size_kw))
            n = self._group_size(_arg(args, kwargs, leaf.group_arg, "group"))
            is_async = bool(_arg(args, kwargs, leaf.async_arg, "async_op", False))
            if self.on_gpu:
                return self._call_gpu(original, args, kwargs, (op, size, n), is_async=is_async)
            began = time.perf_counter()
            result = original(*args, **kwargs)
            issued = time.perf_counter() - began
            if is_async and result is not None and hasattr(result, "wait"):
                return _TimedWork(result, lambda wait: self._record(op, size, n, issued + _clocked(wait)))
            self._record(op, size, n, issued)
            return result

        timed.__wrapped__ = original  # type: ignore[attr-defined]
        timed.__name__ = getattr(original, "__name__", op)
        return timed

    def _call_gpu(
        self,
        original: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: tuple[str, int, int],
        *,
        is_async: bool,
    ) -> Any:
        import torch

        op, size, n = call

        def on_stream(body: Callable[[], Any]) -> None:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()  # type: ignore[no-untyped-call]
            body()
            end.record()  # type: ignore[no-untyped-call]
            with self._lock:
                self._pending.append(_Pending(op, start, end))

        self._record(op, size, n, None)
        if not is_async:
            box: list[Any] = []
            on_stream(lambda: box.append(original(*args, **kwargs)))
            return box[0]
        result = original(*args, **kwargs)
        if result is not None and hasattr(result, "wait"):
            return _TimedWork(result, on_stream)
        return result

    def _record(self, op: str, size: int, n: int, seconds: float | None) -> None:
        duration, sizes, algorithm, bus = self._children[op]
        bus_bytes = size * bus_factor(op, n)
        sizes.observe(size)
        algorithm.inc(size)
        bus.inc(bus_bytes)
        totals = self.totals.by_op[op]
        totals.count += 1
        totals.bytes += size
        totals.bus_bytes += bus_bytes
        if seconds is not None:
            duration.observe(seconds)
            totals.seconds += seconds

    def resolve_gpu_timings(self) -> None:
        """Observe the durations of GPU-timed calls whose events have completed (end of a step)."""
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        waiting: list[_Pending] = []
        for item in pending:
            if item.end.query():
                seconds = item.start.elapsed_time(item.end) / 1000.0
                self._children[item.op][0].observe(seconds)
                self.totals.by_op[item.op].seconds += seconds
            else:
                waiting.append(item)
        if waiting:
            with self._lock:
                self._pending[:0] = waiting


def _clocked(body: Callable[[], Any]) -> float:
    began = time.perf_counter()
    body()
    return time.perf_counter() - began


def deltas(before: dict[str, OpTotals], after: dict[str, OpTotals], ops: Iterable[str] = OPS) -> dict[str, Any]:
    """Per-op change between two snapshots, as plain numbers (JSON-ready)."""
    out: dict[str, Any] = {}
    for op in ops:
        a, b = before[op], after[op]
        if b.count != a.count:
            out[op] = {
                "count": b.count - a.count,
                "bytes": b.bytes - a.bytes,
                "bus_bytes": b.bus_bytes - a.bus_bytes,
                "seconds": b.seconds - a.seconds,
            }
    return out
