"""Fixtures of the Prometheus tier: a real `ftjob operator` with no cluster behind it.

The Prometheus server and the operator process are in tests/support/prometheus_server.py.
Every process started here is stopped by pid in the fixture's teardown.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from finetune_localcluster.ports import free_port
from tests.support.prometheus_server import OperatorProcess, unreachable_kubeconfig
from tests.support.training_runs import REPO, wait_for


@pytest.fixture
def operator_process(tmp_path: Path) -> Iterator[OperatorProcess]:
    """A real `ftjob operator` process, watching namespace ml-test, with no cluster behind it."""
    port, health = free_port(), free_port()
    log = tmp_path / "operator.log"
    kubeconfig = unreachable_kubeconfig(tmp_path / "kubeconfig")
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "finetune_operator.cli.main", "operator", "--namespace", "ml-test",
             "--metrics-address", "127.0.0.1", "--metrics-port", str(port), "--health-port", str(health),
             "--kubeconfig", str(kubeconfig)],
            stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
        )  # fmt: skip
    operator = OperatorProcess(proc, port, log)
    try:

        def serving() -> bool:
            try:
                return "finetune_operator_build_info" in operator.metrics()
            except OSError:
                return False

        if not wait_for(serving, timeout=60, interval=0.25):
            raise RuntimeError(f"ftjob operator did not serve metrics:\n{log.read_text()[-3000:]}")
        yield operator
    finally:
        operator.stop()
