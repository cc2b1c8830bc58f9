"""`python -m tools.demo.prepare STEP`: test.sh builds only DeepSpeed's CPU comm op with it, before
its lanes start; a misspelt step is refused naming the ones there are, before any work."""

from __future__ import annotations

import pytest

from tools.demo import prepare


def test_an_unknown_step_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert prepare.main(["comm-op", "nccl"]) == 2
    err = capsys.readouterr().err
    assert "unknown step nccl" in err and "comm-op" in err and "smollm2" in err


def test_a_chosen_step_runs_alone(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []
    monkeypatch.setitem(prepare.STEPS, "comm-op", ("DeepSpeed CPU comm op", lambda: ran.append("comm-op")))
    monkeypatch.setitem(prepare.STEPS, "smollm2", ("SmolLM2 conversion", lambda: ran.append("smollm2")))
    assert prepare.main(["comm-op"]) == 0
    assert ran == ["comm-op"]
    assert "DeepSpeed CPU comm op: ready in" in capsys.readouterr().out
