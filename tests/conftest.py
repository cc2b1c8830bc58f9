"""Fixtures shared by every tier."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.factories import REPO_ROOT
from tests.support.timeouts import scaled_timeout

if TYPE_CHECKING:
    from finetune_localcluster.mlflow_server import MlflowServer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test's timeout times FTJOB_TEST_TIMEOUT_SCALE (finetune_localcluster.kube.wait_scale),
    as the tooling's waits are: test.sh sets it while its lanes share the machine."""
    from finetune_localcluster.kube import wait_scale

    scale = wait_scale()
    default = float(config.getini("timeout") or 0)
    for item in items:
        seconds = scaled_timeout(item, default, scale)
        if seconds is not None:
            item.add_marker(pytest.mark.timeout(seconds), append=False)  # the nearest marker wins


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def pytest_collection_finish(session: pytest.Session) -> None:
    """The MLflow and vLLM servers' own venvs are made (once per machine: minutes) before any test's
    timeout runs, for the tests that use them (`mlflow_server`, `vllm_venv`)."""
    for fixture, module in (("mlflow_server", "mlflow_server"), ("vllm_venv", "vllm_server")):
        if any(fixture in getattr(item, "fixturenames", ()) for item in session.items):
            server_venv = importlib.import_module(f"finetune_localcluster.{module}").server_venv
            capture = session.config.pluginmanager.getplugin("capturemanager")
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                server_venv()


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The vLLM server's venv (the lock's vllm-server group), made before the timeouts start."""
    from finetune_localcluster.vllm_server import server_venv

    return server_venv()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real MLflow tracking server (PyPI's, sqlite store, artifacts served through it) on
    127.0.0.1, shared by the session: each test uses experiments of its own."""
    from finetune_localcluster.mlflow_server import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as server:
        yield server
