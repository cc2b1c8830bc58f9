"""`python -m tools.demo.prepare STEP`: the demo's once-per-machine work; a misspelt step is
refused naming the ones there are, before any work."""

from __future__ import annotations

import pytest

from tools.demo import prepare


def test_an_unknown_step_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert prepare.main(["smollm2", "comm-op"]) == 2
    err = capsys.readouterr().err
    assert "unknown step comm-op" in err and "smollm2" in err


def test_a_chosen_step_runs_alone(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []
    monkeypatch.setitem(prepare.STEPS, "smollm2", ("SmolLM2 conversion", lambda: ran.append("smollm2")))
    monkeypatch.setitem(prepare.STEPS, "other", ("another step", lambda: ran.append("other")))
    assert prepare.main(["smollm2"]) == 0
    assert ran == ["smollm2"]
    assert "SmolLM2 conversion: ready in" in capsys.readouterr().out
