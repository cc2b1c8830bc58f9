"""Fixtures of the cluster tier: one real local control plane per test run, a namespace per test.

Why: contract tests (CRD, RBAC, Pod Security, StatefulSet behaviour) only mean something
against the real apiserver, controllers and scheduler. Starting them takes tens of seconds,
so the cluster is session-scoped; isolation comes from a fresh namespace per test, deleted
afterwards (its pods with a bounded wait).

Fixtures:
- `local_cluster`: the `LocalCluster` (2 kwok GPU nodes `kwok-gpu-0/1` labelled `type: kwok`,
  8 `nvidia.com/gpu` each, and one process node `process-node-0`, tainted; put pods there
  with `finetune_localcluster.PROCESS_NODE_PLACEMENT`).
  With FTJOB_TEST_CLUSTER_DIR pointing at the work dir of a cluster started by
  `python -m finetune_localcluster up`, that cluster is used and left running.
- `kubeconfig` (Path), `kube` (finetune_localcluster.Kube, raw JSON), `k8s_client`
  (kubernetes.client.ApiClient), `core_v1`, `apps_v1`; `crd`: the FineTuneJob CRD, applied and
  established, without an operator.
- `namespace`: a fresh namespace name; `restricted_namespace`: the same with
  `pod-security.kubernetes.io/enforce: restricted`; `make_namespace(restricted=..., labels=...)`
  for more than one.
Every test collected under this directory gets the `cluster` marker and, unless it sets its
own, a 300 s timeout (the first test's setup includes starting the cluster). The binaries
are built (cold cache: tens of minutes, the time is printed) before the first test starts,
outside any test timeout.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from finetune_localcluster import Kube, LocalCluster
from finetune_localcluster.binaries import ensure_binaries
from finetune_localcluster.devtools import OperatorProcess, install_crd
from finetune_operator.api.crdgen import build_crd
from tests.cluster.operator_harness import namespaces

HERE = Path(__file__).parent
CLUSTER_TIMEOUT_S = 300


def _in_tier(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_tier(item):
            item.add_marker(pytest.mark.cluster)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(CLUSTER_TIMEOUT_S))


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(_in_tier(item) for item in session.items) and not os.environ.get("FTJOB_TEST_CLUSTER_DIR"):
        capture = session.config.pluginmanager.getplugin("capturemanager")
        kueue = any(item.path.name == "test_kueue.py" for item in session.items)
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            # A cold cache builds here, with its progress shown; Kueue only when its tests run.
            ensure_binaries(kueue=kueue)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """`item.rep_setup` / `rep_call`: lets a fixture describe the cluster after its test failed."""
    report: pytest.TestReport = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    existing = os.environ.get("FTJOB_TEST_CLUSTER_DIR")
    if existing:
        yield LocalCluster.attach(existing)
        return
    keep = os.environ.get("FTJOB_KEEP_CLUSTER_LOGS") == "1"
    with LocalCluster(gpu_nodes=2, process_nodes=1, keep_workdir=keep) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kubeconfig(local_cluster: LocalCluster) -> Path:
    return local_cluster.kubeconfig


@pytest.fixture(scope="session")
def kube(kubeconfig: Path) -> Iterator[Kube]:
    client = Kube(kubeconfig)
    yield client
    client.close()


@pytest.fixture(scope="session")
def k8s_client(kubeconfig: Path) -> Iterator[kubernetes.client.ApiClient]:
    client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    yield client
    client.close()


@pytest.fixture(scope="session")
def core_v1(k8s_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(k8s_client)


@pytest.fixture(scope="session")
def apps_v1(k8s_client: kubernetes.client.ApiClient) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(k8s_client)


@pytest.fixture(scope="session")
def operator(kube: Kube, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The one `ftjob operator` of the test run (defined here, once: a fixture imported into
    several modules would start one operator per module, and two operators fight)."""
    install_crd(kube)
    process = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def crd(kube: Kube) -> dict[str, Any]:
    """The FineTuneJob CRD, applied and established (as the operator fixture installs it)."""
    install_crd(kube)
    return kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{build_crd()['metadata']['name']}")


@pytest.fixture
def make_namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    prefix = "t-" + "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-")
    with namespaces(kube, prefix) as make:
        yield make


@pytest.fixture
def namespace(make_namespace: Callable[..., str]) -> str:
    return make_namespace()


@pytest.fixture
def restricted_namespace(make_namespace: Callable[..., str]) -> str:
    return make_namespace(restricted=True)
