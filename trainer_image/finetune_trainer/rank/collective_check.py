"""A test-run guard: every tensor handed to a collective must live on the rank's device.

Why: under NCCL a host tensor in a collective raises at the first step of a multi-GPU
job, but the CPU tiers run gloo, which accepts host tensors, and every tensor there is on
"cpu" anyway. So a device comparison alone cannot fail on CPU. The guard adds what can:
a tensor built by trainer code (a `finetune_trainer` frame) through a factory call
(`torch.tensor`, `torch.zeros`, ...) without a `device=` is marked as host-made, and a
host-made tensor reaching a collective is a violation on any backend, exactly the tensors
that would be on the host under NCCL. Tensors from DeepSpeed, transformers or torch itself
are checked by device only.

Enabled by FTJOB_CHECK_COLLECTIVE_DEVICES=DIR (the trainer tier sets it for every run):
the torch.distributed collectives are wrapped (the package and distributed_c10d, so
DeepSpeed's backend and torch's own helpers are both seen), a violation raises
`CollectiveDeviceError` at the call, and each rank writes DIR/rank-N.json on exit with the
collectives it checked, for tests to assert the guard really ran.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ENV = "FTJOB_CHECK_COLLECTIVE_DEVICES"
COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)
FACTORIES = (
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "rand",
    "randn",
    "randint",
    "linspace",
    "eye",
)
MARK = "_ftjob_host_made"
OWN_PREFIX = "finetune_trainer"


class CollectiveDeviceError(RuntimeError):
    """A collective was handed a tensor that is not on the rank's device."""


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _caller_module() -> str:
    """The module of the first frame outside torch and this guard."""
    frame = sys._getframe(2)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name.startswith("torch") or name == __name__):
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class Guard:
    """The installed guard of one rank: the factory mode, the wrappers, the tallies."""

    def __init__(self, report_dir: Path, rank: int, expected: Callable[[], Any]) -> None:
        self.report_dir = report_dir
        self.rank = rank
        self.expected = expected
        self.checked: Counter[str] = Counter()
        self.violations: list[str] = []
        self._mode: Any = None

    def check(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        device = self.expected()
        for tensor in _tensors([*args, *kwargs.values()]):
            problem = ""
            if getattr(tensor, MARK, False):
                problem = f"created by trainer code without device= (on {tensor.device}, rank device {device})"
            elif tensor.device != device:
                problem = f"on {tensor.device}, rank device {device}"
            if problem:
                message = f"{op}: tensor {tuple(tensor.shape)} {tensor.dtype} {problem}"
                self.violations.append(message)
                self.write()
                raise CollectiveDeviceError(f"collective on the wrong device: {message}")
        self.checked[op] += 1

    def install(self) -> None:
        import torch
        import torch.distributed as package
        import torch.distributed.distributed_c10d as c10d
        from torch.overrides import TorchFunctionMode

        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = self._wrap(name, original)
            for target in (package, c10d):
                if getattr(target, name, None) is original:
                    setattr(target, name, wrapped)
        factories = {getattr(torch, name) for name in FACTORIES}

        class HostMade(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
            ) -> Any:
                kwargs = kwargs or {}
                result = func(*args, **kwargs)
                if func in factories and kwargs.get("device") is None and _caller_module().startswith(OWN_PREFIX):
                    setattr(result, MARK, True)
                return result

        self._mode = HostMade()
        self._mode.__enter__()
        atexit.register(self.write)

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def checked(*args: Any, **kwargs: Any) -> Any:
            self.check(op, args, kwargs)
            return original(*args, **kwargs)

        checked.__wrapped__ = original  # type: ignore[attr-defined]
        checked.__name__ = op
        return checked

    def write(self) -> None:
        report = {
            "rank": self.rank,
            "device": str(self.expected()),
            "checked": dict(self.checked),
            "violations": self.violations,
        }
        self.report_dir.mkdir(parents=True, exist_ok=True)
        (self.report_dir / f"rank-{self.rank}.json").write_text(json.dumps(report, sort_keys=True))


def install_from_env(rank: int) -> Guard | None:
    """Install the guard when FTJOB_CHECK_COLLECTIVE_DEVICES names a report folder."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return None
    from finetune_trainer.rank.devices import rank_device

    guard = Guard(Path(raw), rank, rank_device)
    guard.install()
    return guard
