"""benchmarks/gpu_acceptance.py --dry-run: every case runs the trainer's step on a tiny bf16 model on CPU.

The GPU run cannot happen in CI; the dry run keeps the script working there: section (a) runs
each ZeRO stage with full fine-tuning and LoRA/QLoRA, on padded and packed rows from the trainer's
own collate, (b) a planned strategy for each emulated card, (c) the OutOfMemory root cause.
Every case trains with the chunked LM-head loss (the one the planner counts), saves and loads a
checkpoint through the trainer's checkpoint module and takes a step after the load (the resume
path), and reports its tokens/s; the time budget cuts the table instead of overrunning it.
Each case runs in a process of its own (`isolated`), so what one case leaves allocated cannot
count in the next one's peaks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_acceptance import CASES, COLUMNS, Budget, CaseFailed, isolated
from finetune_localcluster.ports import free_port

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(free_port())}
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_acceptance.py"), "--dry-run", *args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )


def table(stdout: str) -> tuple[list[str], dict[str, list[list[str]]]]:
    rows = [line.split(" | ") for line in stdout.splitlines() if line.count(" | ") == len(COLUMNS) - 1]
    by_section: dict[str, list[list[str]]] = {}
    for row in rows[1:]:
        by_section.setdefault(row[0], []).append(row)
    return rows[0], by_section


@pytest.mark.timeout(960)
def test_dry_run_trains_saves_and_loads_every_case() -> None:
    proc = dry_run("--budget-seconds", "3600")
    assert proc.returncode == 0, proc.stderr[-3000:]
    header, by_section = table(proc.stdout)
    assert header == list(COLUMNS)
    assert sorted(by_section) == ["a", "b", "c"]
    assert len(by_section["a"]) == len(CASES)
    stages = {int(r[1].split("ZeRO-")[1][0]) for r in by_section["a"]}
    methods = {r[1].split()[1] for r in by_section["a"]}
    assert stages == {0, 1, 2, 3} and methods == {"full", "lora", "qlora"}, by_section["a"]
    assert all(" bf16" in r[1] for r in by_section["a"])
    assert [r[1].split(":")[0] for r in by_section["b"]] == [
        "8B lora on 24 GiB",
        "8B lora on 40 GiB",
        "8B lora on 80 GiB",
    ]
    assert {word for r in by_section["a"] for word in r[1].split() if word in ("padded", "packed")} == {
        "padded",
        "packed",
    }, by_section["a"]
    note, checkpoint = COLUMNS.index("note"), COLUMNS.index("checkpoint")
    for row in by_section["a"] + by_section["b"]:
        float(row[COLUMNS.index("planned step GiB")])
        assert float(row[COLUMNS.index("tokens/s")]) > 0, row
        assert row[COLUMNS.index("MFU")] == "-", row  # no peak FLOPs for a CPU
        assert row[note].startswith("ok") and row[note].endswith(", bf16, loss: chunked cross entropy"), row
        assert row[checkpoint].startswith("saved+loaded"), row
        assert row[checkpoint].endswith("restore verified, a step after the resume ok"), row
    qlora_zero3 = next(r for r in by_section["a"] if "qlora ZeRO-3" in r[1])
    float(qlora_zero3[2])  # the planner plans a load peak for QLoRA under ZeRO-3
    assert by_section["c"][0][COLUMNS.index("note")].startswith("OutOfMemory:")
    assert '"skipped": 0' in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("skipped")]


@pytest.mark.timeout(300)
def test_an_exhausted_budget_skips_every_case_and_names_it() -> None:
    proc = dry_run("--budget-seconds", "0", "--sections", "ab")
    assert proc.returncode == 0, proc.stderr[-3000:]
    header, by_section = table(proc.stdout)
    assert header == list(COLUMNS) and by_section == {}
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped (budget of 0s): ")]
    assert skipped[0].endswith("creating the model a")
    assert sum(" | tiny " in line for line in skipped) == len(CASES)
    assert sum("8B lora on" in line for line in skipped) == 3
    assert '"skipped": ' + str(len(skipped)) in proc.stdout


def test_the_budget_starts_a_task_only_while_its_estimate_fits() -> None:
    now = [100.0]
    budget = Budget(60, started=100.0, clock=lambda: now[0])
    assert budget.allows("first", 0)
    now[0] = 130.0
    assert budget.allows("fits", 30)
    assert not budget.allows("too long", 31)
    now[0] = 161.0
    assert not budget.allows("late", 0)
    assert budget.skipped == ["too long", "late"]


HELD: list[bytes] = []


def hold_and_report() -> int:
    HELD.append(bytes(1 << 20))  # what a leaking case would keep
    return os.getpid()


def run_out_of_memory() -> None:
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")


def die() -> None:
    os._exit(7)


def test_a_case_runs_in_its_own_process_and_what_it_holds_goes_with_it() -> None:
    first, second = isolated(hold_and_report, False), isolated(hold_and_report, False)
    assert os.getpid() not in (first, second) and first != second
    assert HELD == []


def test_a_case_that_raises_reports_the_trainers_classification_and_failure_line() -> None:
    with pytest.raises(CaseFailed) as failed:
        isolated(run_out_of_memory, False)
    assert failed.value.reason == "OutOfMemory"
    assert failed.value.summary == "OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB"
    assert failed.value.line.startswith("OutOfMemory: CUDA out of memory. Tried to allocate 3.00 GiB")


def test_a_case_whose_process_dies_is_a_failure_naming_its_exit_code() -> None:
    with pytest.raises(CaseFailed, match="exited with code 7 before it reported"):
        isolated(die, False)


def test_on_the_gpu_a_case_is_spawned_and_its_body_crosses_by_pickle(tiny_model_dir: Path, tmp_path: Path) -> None:
    import pickle
    from functools import partial

    from benchmarks.gpu_acceptance import GIB, job_spec, planned_bytes, train

    spec = job_spec(str(tiny_model_dir), "qlora", 3, True, 64, 2, 141)
    plan, _, _ = planned_bytes(spec)
    body = partial(train, tiny_model_dir, spec, plan, 3, True, tmp_path, 2 * GIB)
    copy = pickle.loads(pickle.dumps(body))
    assert (copy.func, copy.args[0], copy.args[1], copy.args[2]) == (train, tiny_model_dir, spec, plan)
    assert isolated(hold_and_report, True) != os.getpid()  # the spawn path, as on the GPU
