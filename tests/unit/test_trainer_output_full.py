"""A save that fails for lack of space is reported as OutputFull, naming the volume and the
intact checkpoint; other save errors keep their own cause."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from finetune_operator.api.pod_contract import TerminationReason
from finetune_trainer.checkpoint import saves
from finetune_trainer.outcome import classify, failure_line


def test_enospc_anywhere_in_the_cause_chain_is_output_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "step-00000003").mkdir()
    (tmp_path / "step-00000003" / saves.STATE_FILE).write_text('{"globalStep": 3}')
    monkeypatch.setattr(saves, "ALMOST_FULL_BYTES", 0)  # this machine's disk is not full
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("write failed") from inner
    except RuntimeError as exc:
        full = saves.output_full(exc, tmp_path, 6)
    assert full is not None
    assert "no space left on the output volume" in str(full) and "checkpoint step-00000006" in str(full)
    assert "the previous checkpoint step-00000003 is intact" in str(full)
    line = failure_line(full, 0)
    assert line.startswith("OutputFull: ") and line.endswith("(rank 0)")
    assert classify(full) == TerminationReason.OUTPUT_FULL
    assert TerminationReason.OUTPUT_FULL.retried, "space can be freed while the job waits"


def test_another_save_error_with_space_left_keeps_its_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saves, "ALMOST_FULL_BYTES", 0)
    assert saves.output_full(PermissionError(errno.EACCES, "Permission denied"), tmp_path, 6) is None
