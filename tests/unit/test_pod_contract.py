"""The operator↔trainer contract: what the trainer writes is what the operator reads."""

from __future__ import annotations

import json
import pkgutil
from types import ModuleType

import pytest

from finetune_operator.api.pod_contract import (
    RETRIED,
    CheckpointState,
    TerminationReason,
    TrainingSummary,
    is_out_of_memory_text,
    reason_of_line,
)
from finetune_operator.reconcile import lifecycle, policies, termination
from finetune_operator.reconcile.observed import Termination


def term(message: str, code: int = 1, reason: str = "Error") -> Termination:
    return Termination(exit_code=code, reason=reason, message=message, finished_at="2026-12-01T00:00:00Z")


def test_the_trainers_summary_becomes_status_result_field_for_field() -> None:
    written = TrainingSummary(
        final_loss=0.5,
        steps=40,
        tokens=1234,
        samples=320,
        adapter_uri="pvc://out/job/adapter",
        merged_model_uri="pvc://out/job/merged",
        wall_seconds=12.5,
        eval_loss=0.4,
        eval_loss_before=2.0,
        exact_match=0.75,
        exact_match_before=0.0,
        skipped_records=3,
    )
    read = termination.summary_of(term(written.to_message(), code=0, reason="Completed"))
    assert read == written
    result = read.to_result()
    assert (result.adapter_uri, result.merged_model_uri) == ("pvc://out/job/adapter", "pvc://out/job/merged")
    assert (result.final_loss, result.eval_loss, result.eval_loss_before) == (0.5, 0.4, 2.0)
    assert (result.exact_match, result.exact_match_before) == (0.75, 0.0)
    assert (result.steps, result.tokens, result.skipped_records, result.wall_seconds) == (40, 1234, 3, 12.5)


def test_a_full_fine_tuning_summary_points_the_result_at_the_model() -> None:
    summary = TrainingSummary(steps=1, tokens=2, model_uri="s3://bucket/run/model")
    result = summary.to_result()
    assert (result.model_uri, result.adapter_uri) == ("s3://bucket/run/model", None)


@pytest.mark.parametrize(
    "message",
    [
        "",
        "not json",
        "[1, 2]",
        json.dumps({"finalLoss": 0.1}),  # no steps/tokens: not a summary the trainer writes
        json.dumps({"steps": -1, "tokens": 0}),
    ],
)
def test_what_is_not_a_summary_gives_no_result(message: str) -> None:
    assert termination.summary_of(term(message, code=0)) is None


def test_keys_a_newer_trainer_adds_are_ignored() -> None:
    message = json.dumps({"steps": 3, "tokens": 9, "finalLoss": 1.5, "somethingNew": {"x": 1}})
    summary = termination.summary_of(term(message, code=0))
    assert summary is not None and summary.steps == 3 and summary.final_loss == 1.5


INPUT_ERRORS = {TerminationReason.CONFIG_ERROR, TerminationReason.DATA_ERROR, TerminationReason.STORAGE_ACCESS_DENIED}
"""The reasons the operator never retried (`pod_contract.NOT_RETRIED` before the decision became a
property of the reason): the job's own input is wrong."""


@pytest.mark.parametrize("reason", list(TerminationReason))
def test_every_reason_is_read_back_and_only_input_errors_are_not_retried(reason: TerminationReason) -> None:
    line = f"{reason}: something happened (rank 1)"
    assert reason_of_line(line) == reason
    assert reason.retried == (reason not in INPUT_ERRORS)
    assert termination.not_retried(term(line)) == (reason if reason in INPUT_ERRORS else None)


def test_the_retry_table_decides_every_reason_and_nothing_else() -> None:
    assert list(RETRIED) == list(TerminationReason)
    assert all(isinstance(retried, bool) for retried in RETRIED.values())


def test_a_reason_in_the_middle_of_a_line_is_not_the_root_cause() -> None:
    assert reason_of_line("RuntimeError: DataError: inside") is None
    assert termination.not_retried(term("Traceback ...\nValueError: DataError: x")) is None


@pytest.mark.parametrize(
    "text",
    [
        "OutOfMemory: CUDA out of memory. Tried to allocate 2.00 GiB (rank 3)",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "OSError: [Errno 12] Cannot allocate memory",
    ],
)
def test_both_sides_recognise_the_same_out_of_memory_errors(text: str) -> None:
    from finetune_trainer import outcome

    assert is_out_of_memory_text(text) and outcome.is_oom_text(text)
    assert termination.is_out_of_memory(term(text))


@pytest.mark.parametrize(
    "text",
    [
        "NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
        "misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_dmabuf_mr failed with error Cannot allocate memory",
        "NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory",
    ],
)
def test_an_rdma_registration_failure_is_a_network_error_on_both_sides(text: str) -> None:
    from finetune_trainer import outcome

    error = RuntimeError(f"NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error; {text}")
    assert not is_out_of_memory_text(text) and not termination.is_out_of_memory(term(str(error)))
    assert outcome.classify(error) == TerminationReason.NETWORK_ERROR
    line = outcome.failure_line(error, 3)
    assert line.startswith("NetworkError: NCCL could not register memory") and "RLIMIT_MEMLOCK" in line
    assert "ibv_" in line and line.endswith("(rank 3)")
    assert not termination.is_out_of_memory(term(line))


def test_a_sigkill_line_is_not_out_of_memory() -> None:
    line = "RankKilled: rank 1 on node 0 died without an error message (SIGKILL, exit 137: the kernel's memory killer)"
    assert not is_out_of_memory_text(line)


def test_checkpoint_state_reads_files_written_before_it_was_typed() -> None:
    legacy = {"global_step": 20, "tokens": 100, "samples": 8, "last_loss": 0.3, "eval_before": {"eval_loss": 2.0}}
    state = CheckpointState.from_file(json.dumps(legacy))
    assert state.global_step == 20 and state.eval_before == {"eval_loss": 2.0}
    assert CheckpointState.from_file(state.to_file()) == state
    with pytest.raises(ValueError, match="globalStep"):
        CheckpointState.from_file(json.dumps({"tokens": 1}))


def test_checkpoint_state_round_trips_the_strategy_that_wrote_it() -> None:
    from finetune_operator.api.pod_contract import CheckpointFormat
    from finetune_operator.api.strategy import Strategy

    zero2 = Strategy(zero_stage=2, micro_batch_size=2, gradient_accumulation_steps=2, world_size=2)
    state = CheckpointState(global_step=6, strategy=zero2, checkpoint_format=CheckpointFormat.TRAINABLE)
    text = state.to_file()
    assert '"zeroStage": 2' in text and '"checkpointFormat": "trainable"' in text
    assert CheckpointState.from_file(text) == state
    zero3 = zero2.model_copy(update={"zero_stage": 3, "offload_optimizer": "cpu"})
    assert zero2.changes(zero3) == ["offloadOptimizer: none -> cpu", "zeroStage: 2 -> 3"]
    assert str(zero3) == "ZeRO-3, optimizer offload cpu, micro-batch 2 x accumulation 2 x world 2"
    assert zero3.global_batch == 8


def test_every_policy_module_is_a_phase_of_the_lifecycle() -> None:
    # child_write amends a decision after a child could not be written: the runner calls it;
    # tracking records rank 0's report with the gang verdict
    modules = {m.name for m in pkgutil.iter_modules(policies.__path__)} - {"child_write", "tracking"}
    named = vars(lifecycle).values()
    used = {v.__name__ for v in named if isinstance(v, ModuleType)}
    used |= {m for v in named if callable(v) and isinstance(m := getattr(v, "__module__", None), str)}
    assert {f"{policies.__name__}.{m}" for m in modules} <= used
    assert [p.__module__.rsplit(".", 1)[-1] for p in lifecycle.WORKER_POLICIES] == [
        "success",
        "preemption",
        "failure",
        "config_change",
    ]
