"""The Helm chart in the real apiserver, and the operator running with the chart's own RBAC.

`helm install` must be accepted with PodSecurity `restricted` enforced; the operator then
runs with a kubeconfig made from the chart's ServiceAccount token (not admin), and takes a
tiny job through the process node to Succeeded: any verb missing from the chart's role
fails this test. Upgrade and uninstall must leave no orphans; the CRD stays, as Helm does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim, helm, kubectl, service_account_kubeconfig
from tests.cluster.operator_harness import Jobs
from tests.cluster.process_jobs import CLAIM, tiny_job

CHART = Path(__file__).resolve().parents[2] / "charts" / "finetune-operator"
RELEASE = "ftjob"
CHART_LABEL = "app.kubernetes.io/instance=ftjob"

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def owned_by_chart(kube: Kube, ns: str) -> list[str]:
    paths = {
        "deployments": f"/apis/apps/v1/namespaces/{ns}/deployments",
        "services": f"/api/v1/namespaces/{ns}/services",
        "serviceaccounts": f"/api/v1/namespaces/{ns}/serviceaccounts",
        "configmaps": f"/api/v1/namespaces/{ns}/configmaps",
        "clusterroles": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "clusterrolebindings": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    }
    return [f"{kind}/{o['metadata']['name']}" for kind, path in paths.items()
            for o in kube.items(path, labelSelector=CHART_LABEL)]  # fmt: skip


@pytest.fixture
def installed(kubeconfig: Path, make_namespace: Any, kube: Kube) -> Iterator[str]:
    ns = make_namespace(restricted=True)
    helm(kubeconfig, "lint", str(CHART), "--strict")
    helm(kubeconfig, "install", RELEASE, str(CHART), "--namespace", ns, "--wait=false",
         "--set", "operator.trainerImage.tag=test")  # fmt: skip
    yield ns
    helm(kubeconfig, "uninstall", RELEASE, "--namespace", ns)


def test_chart_installs_and_its_service_account_runs_a_job(
    installed: str,
    kubeconfig: Path,
    kube: Kube,
    local_cluster: LocalCluster,
    operator: OperatorProcess,
    make_namespace: Any,
    tmp_path: Path,
) -> None:
    deployment = kube.get(f"/apis/apps/v1/namespaces/{installed}/deployments/{RELEASE}-finetune-operator")
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    wait_for(lambda: kube.items(f"/api/v1/namespaces/{installed}/pods", labelSelector=CHART_LABEL), 60,
             "the operator pod to pass admission (PodSecurity restricted)")  # fmt: skip
    job_ns = make_namespace(restricted=True)
    bind_claim(kube, job_ns, CLAIM)
    config = service_account_kubeconfig(kube, local_cluster, installed, sa, tmp_path / "sa.kubeconfig")
    operator.stop()  # one operator at a time: this test's runs with the chart's credentials
    chart_operator = OperatorProcess(config, tmp_path / "operator.log")
    try:
        chart_operator.start()
        doc = tiny_job(job_ns, max_steps=16, checkpoint_every=8)
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
        jobs = Jobs(kube, job_ns)
        status = jobs.wait_state("Succeeded", name="tiny-cpu", timeout=600)
        assert status["result"]["steps"] == 16
        log = chart_operator.log_tail(400)
        # the apiserver's denials read "... is forbidden: User ..." and kopf's "403 Forbidden"; a bare
        # "403" would also match a log timestamp's milliseconds (",403"). A write into another test's
        # namespace while it terminates is also "forbidden" (NamespaceTerminating: no RBAC denial); this
        # operator watches every namespace, so those lines are left out.
        denied = [line for line in log.splitlines() if "forbidden" in line.lower() and "being terminated" not in line]
        assert denied == [], log
    finally:
        chart_operator.stop()
        operator.start()


def test_upgrade_and_uninstall_leave_no_orphans(kubeconfig: Path, kube: Kube, make_namespace: Any) -> None:
    ns = make_namespace(restricted=True)
    helm(kubeconfig, "install", RELEASE, str(CHART), "--namespace", ns, "--set", "serviceMonitor.enabled=false")
    before = set(owned_by_chart(kube, ns))
    assert any(k.startswith("deployments/") for k in before) and any(k.startswith("clusterroles/") for k in before)
    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", ns, "--set", "watchNamespaces={" + ns + "}")
    after = set(owned_by_chart(kube, ns))
    assert not any(k.startswith("clusterroles/") for k in after), "namespaced mode must drop the ClusterRole"
    roles = kube.items(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", labelSelector=CHART_LABEL)
    assert roles, "namespaced mode grants a Role in each watched namespace"
    helm(kubeconfig, "uninstall", RELEASE, "--namespace", ns)
    wait_for(lambda: not owned_by_chart(kube, ns), 60, "every chart object to be removed")
    assert kube.get_or_none("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/finetunejobs.finetune.dev")
