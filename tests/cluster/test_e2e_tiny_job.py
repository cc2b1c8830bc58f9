"""End to end: `kubectl apply` of the tiny CPU job, real ranks on the process node.

Nothing is simulated here but the GPUs: the operator renders, the StatefulSet controller
creates two pods, the scheduler binds them to the process node, which runs
`ftjob train --config /etc/ftjob` in each with the rendered hostfile, env and volumes;
two real DeepSpeed ranks train together over gloo, write checkpoints to the claim, and
report through the termination log.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim, kubectl
from tests.cluster.operator_harness import Jobs
from tests.cluster.process_jobs import CLAIM, tiny_job, worker_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def tiny(kube: Kube, restricted_namespace: str, operator: OperatorProcess) -> Jobs:
    bind_claim(kube, restricted_namespace, CLAIM)
    return Jobs(kube, restricted_namespace)


def output_dir(cluster: LocalCluster, namespace: str) -> Path:
    return cluster.workdir / "pvc" / namespace / CLAIM / "tiny-cpu"


def test_tiny_job_trains_to_success(tiny: Jobs, kubeconfig: Path, local_cluster: LocalCluster) -> None:
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(tiny_job(tiny.ns, max_steps=80, checkpoint_every=40)))
    status = tiny.wait(lambda s: (s.get("progress") or {}).get("step", 0) > 0, "progress from rank 0's metrics",
                       name="tiny-cpu", timeout=420)  # fmt: skip
    table = kubectl(kubeconfig, "get", "ftj", "-n", tiny.ns)
    assert "Running" in table and "/80" in table, table
    assert status["progress"]["totalSteps"] == 80
    status = tiny.wait_state("Succeeded", name="tiny-cpu", timeout=600)
    result = status["result"]
    assert result["steps"] == 80 and result["finalLoss"] > 0
    assert status["progress"]["summary"] == "80/80 (100%)"
    assert result["adapterUri"] == "/mnt/pvc/ftjob-output/tiny-cpu/adapter"
    out = output_dir(local_cluster, tiny.ns)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    wait_for(lambda: (s := tiny.statefulset("tiny-cpu")) and s["spec"]["replicas"] == 0, 60, "scale to 0")


def test_killed_rank_gang_restarts_and_resumes(tiny: Jobs, kubeconfig: Path, local_cluster: LocalCluster) -> None:
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(tiny_job(tiny.ns, max_steps=40, checkpoint_every=8)))
    out = output_dir(local_cluster, tiny.ns)
    tiny.wait(lambda s: (s.get("progress") or {}).get("step", 0) >= 12, "training past the first checkpoint",
              name="tiny-cpu", timeout=480)  # fmt: skip
    assert any(out.glob("checkpoints/*")), list(out.rglob("*"))[:20]
    victims = wait_for(lambda: worker_pids("tiny-cpu-1", tiny.ns), 30, "the rank of pod tiny-cpu-1")
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    status = tiny.wait(lambda s: s.get("restarts") == 1, "a gang restart", name="tiny-cpu", timeout=180)
    assert status["lastFailure"]["rank"] in (0, 1)

    def resumed() -> bool:
        try:
            return "resumed from" in kubectl(kubeconfig, "logs", "-n", tiny.ns, "tiny-cpu-0")
        except subprocess.CalledProcessError:
            return False  # the new pod is not there yet

    wait_for(resumed, 300, "the new gang to resume from the checkpoint")
    status = tiny.wait_state("Succeeded", name="tiny-cpu", timeout=600)
    assert status["restarts"] == 1, f"a second gang restart: {status.get('lastFailure')}"
    assert status["result"]["steps"] == 40
    tiny.wait_events({"RankFailed", "Completed"}, name="tiny-cpu")
