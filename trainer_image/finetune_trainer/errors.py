"""The trainer's known failures: one base class, whose subclasses name the root cause the operator acts on.

A failed run ends with one line `<Reason>: <message>` (`outcome`), and the operator retries,
re-plans or fails the job by that reason (`TerminationReason.retried`, in the API, so both sides
read one table). A failure the trainer knows is a subclass of `TrainerError` that carries its
`reason`: where it is raised decides what the operator does, and `outcome.classify` needs no list
of classes. An exception that is not ours (a library's, the allocator's) is classified by the
few rules `outcome` keeps for those: an allocator failure is `OutOfMemory`, an RDMA memory
registration failure `NetworkError`, anything else `TrainingError`.

`TrainerError` derives from BaseException, not Exception, so that `StoppedBySignal` and
`Preempted` can be ones while they pass through `except Exception`; every other one is also a
RuntimeError, its base before it had this one. Each process catches them once: the rank worker
(`worker.run_rank`) and the entrypoint (`launch.train`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from finetune_operator.api.pod_contract import TerminationReason


class TrainerError(BaseException):
    """A failure the trainer knows; `reason` is the first word of its termination message."""

    reason: ClassVar[TerminationReason]
    quoted_text_decides: ClassVar[bool] = True
    """Whether an allocator or RDMA registration failure quoted in the message names the root cause
    instead of `reason`, as for a foreign exception: a model whose loading failed with `[Errno 12]
    Cannot allocate memory` ran out of memory, whatever wrapped the OSError. Object-store errors
    say no: their reason is the store's answer, whatever text that answer carries."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "reason", None), TerminationReason):
            raise TypeError(f"{cls.__qualname__}: a TrainerError names its TerminationReason (class attribute reason)")
