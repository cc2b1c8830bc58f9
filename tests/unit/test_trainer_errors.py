"""The trainer's known failures carry their own reason: the same reasons (and the same lines) the
isinstance ladder in `outcome.classify` gave before issue 44, and the same retry decisions as the
operator's former NOT_RETRIED list."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import pytest

import finetune_trainer
from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.reconcile import termination
from finetune_operator.reconcile.observed import Termination
from finetune_trainer.checkpoint.saves import OutputFull
from finetune_trainer.data.loading import DataError, DataUnavailable
from finetune_trainer.errors import TrainerError
from finetune_trainer.model.modeling import LoraSettingError, ModelNotFound
from finetune_trainer.model.start_adapter import AdapterNotFound
from finetune_trainer.outcome import StoppedBySignal, classify, failure_line
from finetune_trainer.pod.download_gate import DownloadTimeout
from finetune_trainer.pod.s3_inputs import UnsafeObjectKey
from finetune_trainer.preemption import Preempted
from finetune_trainer.settings import ConfigError
from finetune_trainer.storage.objstore import StoreAccessDenied, StoreError, StoreNotFound, StoreUnavailable

R = TerminationReason
LADDER: dict[type[TrainerError], TerminationReason] = {
    ConfigError: R.CONFIG_ERROR,
    LoraSettingError: R.CONFIG_ERROR,
    ModelNotFound: R.MODEL_NOT_FOUND,
    AdapterNotFound: R.MODEL_NOT_FOUND,
    DataError: R.DATA_ERROR,
    DataUnavailable: R.DATA_UNAVAILABLE,
    StoreError: R.DATA_UNAVAILABLE,
    StoreUnavailable: R.DATA_UNAVAILABLE,
    StoreNotFound: R.DATA_UNAVAILABLE,
    UnsafeObjectKey: R.DATA_UNAVAILABLE,
    StoreAccessDenied: R.STORAGE_ACCESS_DENIED,
    OutputFull: R.OUTPUT_FULL,
    StoppedBySignal: R.TERMINATED,
}
"""What the old ladder returned for each class caught on a rank (message without quoted text)."""
OWN_LINE: dict[type[TrainerError], TerminationReason] = {
    DownloadTimeout: R.DOWNLOAD_TIMEOUT,  # the entrypoint wrote `DownloadTimeout: ...` for it
    Preempted: R.PREEMPTED,  # its message is the `Preempted: ...` line; the worker catches it first
}
"""Classes the old ladder never saw (TrainingError had it seen them): their reason is the one of the
line written for them."""
STORE = {StoreError, StoreUnavailable, StoreNotFound, UnsafeObjectKey, StoreAccessDenied}
"""The old ladder's first rungs: their reason held whatever text the message quoted."""
OOM_TEXT = "CUDA out of memory. Tried to allocate 2 GiB"
RDMA_TEXT = "ibv_reg_mr failed: Cannot allocate memory"


def raised(cls: type[TrainerError], text: str) -> TrainerError:
    return Preempted(5, 10, "step-5") if cls is Preempted else cls(text)


def every_subclass(cls: type[TrainerError]) -> Iterator[type[TrainerError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from every_subclass(sub)


@pytest.fixture(scope="module")
def all_trainer_errors() -> set[type[TrainerError]]:
    """Every TrainerError subclass the trainer defines (each of its modules imported)."""
    for module in pkgutil.walk_packages(finetune_trainer.__path__, "finetune_trainer."):
        importlib.import_module(module.name)
    return {c for c in every_subclass(TrainerError) if c.__module__.startswith("finetune_trainer.")}


def test_every_trainer_error_is_in_the_table_with_a_reason(all_trainer_errors: set[type[TrainerError]]) -> None:
    assert all_trainer_errors == set(LADDER) | set(OWN_LINE)
    for cls in all_trainer_errors:
        assert isinstance(cls.reason, TerminationReason), cls


def test_a_trainer_error_without_a_reason_is_refused_where_it_is_defined() -> None:
    with pytest.raises(TypeError, match=r"Unnamed: a TrainerError names its TerminationReason"):

        class Unnamed(TrainerError):
            pass


@pytest.mark.parametrize("cls", list(LADDER), ids=lambda c: c.__name__)
def test_each_error_on_a_rank_has_the_reason_the_old_ladder_gave(cls: type[TrainerError]) -> None:
    assert cls.reason == LADDER[cls]
    assert classify(raised(cls, "it failed")) == LADDER[cls]
    assert failure_line(raised(cls, "it failed"), 3) == f"{LADDER[cls]}: it failed (rank 3)"
    assert failure_line(raised(cls, ""), 3) == f"{LADDER[cls]}: {cls.__name__} (rank 3)"


@pytest.mark.parametrize("cls", list(LADDER), ids=lambda c: c.__name__)
def test_quoted_allocator_or_rdma_text_outranks_the_reason_except_for_the_store(cls: type[TrainerError]) -> None:
    own = cls in STORE
    assert classify(raised(cls, OOM_TEXT)) == (LADDER[cls] if own else R.OUT_OF_MEMORY)
    assert classify(raised(cls, RDMA_TEXT)) == (LADDER[cls] if own else R.NETWORK_ERROR)


def test_the_lines_are_the_old_ones_byte_for_byte() -> None:
    assert failure_line(ModelNotFound(OOM_TEXT), 3) == f"OutOfMemory: {OOM_TEXT} (rank 3)"
    assert failure_line(StoreError(OOM_TEXT), 3) == f"DataUnavailable: {OOM_TEXT} (rank 3)"
    assert failure_line(DataError(RDMA_TEXT), 3) == (
        "NetworkError: NCCL could not register memory with the RDMA device: raise the pod's locked-memory "
        "limit (the container runtime's RLIMIT_MEMLOCK; IPC_LOCK does not lift it for a non-root user), or "
        "set NCCL_IB_DISABLE=1 in spec.env to fall back to TCP (DataError: ibv_reg_mr failed: Cannot "
        "allocate memory) (rank 3)"
    )
    assert str(Preempted(5, 10, "step-5")) == (
        "Preempted: asked to stop (SIGTERM); stopped at the boundary of step 5 of 10 after saving checkpoint "
        "step-5: no step is lost"
    )


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (MemoryError(), "OutOfMemory: MemoryError (rank 1)"),
        (RuntimeError("CUBLAS_STATUS_ALLOC_FAILED"), "OutOfMemory: CUBLAS_STATUS_ALLOC_FAILED (rank 1)"),
        (type("OutOfMemoryError", (RuntimeError,), {})("CUDA"), "OutOfMemory: CUDA (rank 1)"),
        (ValueError("x"), "TrainingError: ValueError: x (rank 1)"),
        (KeyboardInterrupt(), "TrainingError: KeyboardInterrupt: KeyboardInterrupt (rank 1)"),
    ],
)
def test_a_foreign_exception_is_out_of_memory_or_a_training_error(error: BaseException, line: str) -> None:
    assert failure_line(error, 1) == line


@pytest.mark.parametrize("cls", [*LADDER, *OWN_LINE], ids=lambda c: c.__name__)
def test_the_operator_retries_each_error_as_before(cls: type[TrainerError]) -> None:
    not_retried_before: set[type[TrainerError]] = {ConfigError, LoraSettingError, DataError, StoreAccessDenied}
    assert cls.reason.retried == (cls not in not_retried_before)
    line = f"{cls.reason}: something (rank 0)"
    read = termination.not_retried(Termination(exit_code=1, reason="Error", message=line, finished_at=""))
    assert read == (None if cls.reason.retried else cls.reason)


def test_the_errors_keep_the_bases_code_catches_them_by() -> None:
    for cls in {*LADDER, DownloadTimeout} - {StoppedBySignal}:
        assert issubclass(cls, RuntimeError), cls
    for cls in (StoppedBySignal, Preempted):  # `except Exception` must not stop them
        assert not issubclass(cls, Exception)
    assert issubclass(LoraSettingError, ConfigError) and issubclass(DataUnavailable, DataError)
    assert issubclass(StoreAccessDenied, StoreError) and issubclass(UnsafeObjectKey, StoreError)
