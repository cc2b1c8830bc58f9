"""The robustness tier: hostile and careless input against the real control plane.

Runnable alone (`pytest tests/robustness`) and part of CI. Its own local control plane,
package-scoped so it stops when the tier ends (the cluster tier's stays up for its own tests).
Every test here gets the `robustness` and `cluster` markers and a 600 s timeout unless it sets
its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from finetune_localcluster import Kube, LocalCluster
from finetune_localcluster.binaries import ensure_binaries
from finetune_localcluster.devtools import OperatorProcess, install_crd

HERE = Path(__file__).parent
TIMEOUT_S = 600


def _in_tier(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_tier(item):
            item.add_marker(pytest.mark.robustness)
            item.add_marker(pytest.mark.cluster)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TIMEOUT_S))


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(_in_tier(item) for item in session.items):
        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            ensure_binaries()


@pytest.fixture(scope="package")
def robust_cluster() -> Iterator[LocalCluster]:
    keep = os.environ.get("FTJOB_KEEP_CLUSTER_LOGS") == "1"
    with LocalCluster(gpu_nodes=2, process_nodes=0, keep_workdir=keep) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def robust_kube(robust_cluster: LocalCluster) -> Iterator[Kube]:
    client = Kube(robust_cluster.kubeconfig)
    install_crd(client)
    yield client
    client.close()


@pytest.fixture(scope="package")
def robust_operator(
    robust_cluster: LocalCluster, robust_kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(robust_cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    process.start()
    yield process
    process.stop()
