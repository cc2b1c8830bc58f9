"""`python -m finetune_localcluster prebuild`: test.sh builds Kueue, the S3 server and MLflow's venv
before its lanes, outside every test's timeout. Both builds run at once; a failure in either is
one line naming it, reported after both have ended (a half-finished Go build is never abandoned),
and the command exits 1 without a traceback."""

from __future__ import annotations

import threading

import pytest

from finetune_localcluster import __main__ as cli
from finetune_localcluster.prebuild import prebuild


def test_the_mlflow_install_runs_beside_the_go_build() -> None:
    both_running = threading.Barrier(2, timeout=10)  # broken (an error) unless the two overlap
    lines: list[str] = []
    assert prebuild(build_binaries=both_running.wait, install_mlflow=both_running.wait, say=lines.append) == []
    assert sorted(line.split(":")[0] for line in lines) == [
        "[prebuild] Kubernetes, Kueue and SeaweedFS binaries",
        "[prebuild] MLflow server venv",
    ]
    assert all("ready in" in line for line in lines)


def test_a_failed_install_is_reported_after_the_build_ends() -> None:
    finished: list[str] = []

    def install() -> None:
        raise RuntimeError("pip: no matching distribution for mlflow==9")

    lines: list[str] = []
    failed = prebuild(build_binaries=lambda: finished.append("go"), install_mlflow=install, say=lines.append)
    assert failed == ["MLflow server venv"]
    assert finished == ["go"]
    assert any("MLflow server venv: FAILED (pip: no matching distribution" in line for line in lines)


def test_the_cli_command_runs_the_prebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def ok() -> list[str]:
        calls.append("prebuild")
        return []

    monkeypatch.setattr(cli, "prebuild", ok)
    assert cli.main(["prebuild"]) == 0
    assert calls == ["prebuild"]


def test_the_cli_command_exits_1_naming_what_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "prebuild", lambda: ["Kubernetes, Kueue and SeaweedFS binaries"])
    assert cli.main(["prebuild"]) == 1
    assert "prebuild failed: Kubernetes, Kueue and SeaweedFS binaries" in capsys.readouterr().err
