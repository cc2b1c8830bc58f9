"""End to end: `kubectl apply` of the tiny CPU job, real ranks on the process node.

Nothing is simulated here but the GPUs: the operator renders, the StatefulSet controller
creates two pods, the scheduler binds them to the process node, which runs
`ftjob train --config /etc/ftjob` in each with the rendered hostfile, env and volumes;
two real DeepSpeed ranks train together over gloo, write checkpoints to the claim, and
report through the termination log.

One job runs uninterrupted (module-scoped: it is also the reference). The same job is then run
with its ranks SIGKILLed three times: once from outside at a random step after the first
checkpoint, once (rank 0) in the middle of writing a checkpoint, once at a random later step.
Each kill is a gang restart from the newest complete checkpoint; the final adapter must equal
the uninterrupted one. A node drain (one pod evicted) is a preemption instead: the ranks save the
step they stop at, and the gang restarts without spending a restart or losing a step.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim, kubectl
from tests.cluster.operator_harness import Jobs, namespaces
from tests.cluster.process_jobs import CLAIM, assert_same_adapter, output_dir, tiny_job, worker_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_STEPS, CHECKPOINT_EVERY = 40, 8


@dataclass
class Finished:
    jobs: Jobs
    status: dict[str, Any]
    table_while_running: str
    totals_while_running: int
    out: Path


@pytest.fixture(scope="module")
def uninterrupted(
    kube: Kube, kubeconfig: Path, local_cluster: LocalCluster, operator: OperatorProcess
) -> Iterator[Finished]:
    with namespaces(kube, "t-e2e-uninterrupted") as make:
        jobs = Jobs(kube, make(restricted=True))
        bind_claim(kube, jobs.ns, CLAIM)
        doc = tiny_job(jobs.ns, max_steps=MAX_STEPS, checkpoint_every=CHECKPOINT_EVERY)
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
        status = jobs.wait(lambda s: (s.get("progress") or {}).get("step", 0) > 0, "progress from rank 0's metrics",
                           name="tiny-cpu", timeout=900)  # fmt: skip
        table = kubectl(kubeconfig, "get", "ftj", "-n", jobs.ns)
        total = status["progress"]["totalSteps"]
        status = jobs.wait_state("Succeeded", name="tiny-cpu", timeout=600)
        yield Finished(jobs, status, table, total, output_dir(local_cluster, jobs.ns))


@pytest.fixture
def tiny(kube: Kube, restricted_namespace: str, operator: OperatorProcess) -> Jobs:
    bind_claim(kube, restricted_namespace, CLAIM)
    return Jobs(kube, restricted_namespace)


def test_tiny_job_trains_to_success(uninterrupted: Finished) -> None:
    run = uninterrupted
    assert "Running" in run.table_while_running and f"/{MAX_STEPS}" in run.table_while_running, run.table_while_running
    assert run.totals_while_running == MAX_STEPS
    result = run.status["result"]
    assert result["steps"] == MAX_STEPS and result["finalLoss"] > 0
    assert run.status["progress"]["summary"] == f"{MAX_STEPS}/{MAX_STEPS} (100%)"
    assert result["adapterUri"] == "pvc://ftjob-output/tiny-cpu/adapter"
    assert (run.out / "adapter" / "adapter_model.safetensors").is_file()
    wait_for(lambda: (s := run.jobs.statefulset("tiny-cpu")) and s["spec"]["replicas"] == 0, 60, "scale to 0")


@pytest.fixture
def described_on_failure(tiny: Jobs, operator: OperatorProcess, request: pytest.FixtureRequest) -> Iterator[None]:
    """On a failure, print what the job and its pods looked like and the operator's log tail."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(tiny.describe("tiny-cpu"))
        print("operator log:", operator.log_tail())


@pytest.mark.usefixtures("described_on_failure")
def test_ranks_killed_three_times_resume_to_the_uninterrupted_adapter(
    tiny: Jobs, kubeconfig: Path, local_cluster: LocalCluster, uninterrupted: Finished
) -> None:
    rng = random.Random()
    # From outside once rank 0 has logged a random step after step 8's checkpoint (timed by the
    # train log itself: the status's progress lags by a scrape, and a kill timed by it or by a
    # clock could land after step 16's save, in the same gang as the next kill); rank 0 inside
    # step 16's save; a random later step.
    outside = rng.randrange(CHECKPOINT_EVERY + 1, CHECKPOINT_EVERY + 5)
    save = 2 * CHECKPOINT_EVERY
    later = rng.randrange(save + 1, 3 * CHECKPOINT_EVERY)
    kills = f"outside at step {outside}, during step {save}'s save, at step {later}"
    doc = tiny_job(tiny.ns, max_steps=MAX_STEPS, checkpoint_every=CHECKPOINT_EVERY)
    doc["spec"]["env"] = [{"name": "FTJOB_FAULT_KILL", "value": f"save:{save},step:{later}"}]
    doc["spec"]["failurePolicy"] = {"backoffLimit": 5}
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
    out = output_dir(local_cluster, tiny.ns)

    log = out / "train_log.jsonl"

    def logged(step: int) -> bool:
        lines = log.read_text().splitlines() if log.exists() else []
        return any(json.loads(line).get("step", 0) >= step and "loss" in line for line in lines if line.strip())

    wait_for(lambda: logged(outside), 480, f"rank 0 to log step {outside}", interval=0.05)
    victims = wait_for(lambda: worker_pids("tiny-cpu-1", tiny.ns), 30, "the rank of pod tiny-cpu-1")
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    status = tiny.wait(lambda s: s.get("restarts", 0) >= 1, "the first gang restart", name="tiny-cpu", timeout=180)
    assert status["lastFailure"]["rank"] in (0, 1), (kills, status["lastFailure"])

    def resumed() -> bool:
        try:
            return "resumed from" in kubectl(kubeconfig, "logs", "-n", tiny.ns, "tiny-cpu-0")
        except subprocess.CalledProcessError:
            return False  # the new pod is not there yet

    wait_for(resumed, 300, f"the new gang to resume from the checkpoint ({kills})")
    status = tiny.wait_state("Succeeded", name="tiny-cpu", timeout=780)
    assert status["restarts"] == 3, (kills, status.get("lastFailure"))
    assert status["result"]["steps"] == MAX_STEPS
    assert not list(out.glob("checkpoints/.tmp-*")) and not list(out.glob("checkpoints/corrupt-*")), kills
    tiny.wait_events({"RankFailed", "Completed"}, name="tiny-cpu")
    assert_same_adapter(out, uninterrupted.out, kills)


def _logged_steps(train_log: Path) -> list[int]:
    """The optimizer steps rank 0 logged, in order, over every gang."""
    lines = train_log.read_text().splitlines() if train_log.exists() else []
    return [e["step"] for e in map(json.loads, filter(str.strip, lines)) if "loss" in e]


@pytest.mark.usefixtures("described_on_failure")
def test_an_evicted_pod_stops_its_gang_with_a_checkpoint_and_spends_no_restart(
    tiny: Jobs, kube: Kube, kubeconfig: Path, local_cluster: LocalCluster
) -> None:
    """A node drain evicts one pod: its ranks and their peers in the other pod stop at the same step
    boundary with a checkpoint (`Preempted`), the operator restarts the gang without spending a
    restart (the backoff limit is 0), and the resumed run takes each step exactly once. (That the
    adapter then equals an uninterrupted run's, the trainer tier shows: test_resume.py.)"""
    doc = tiny_job(tiny.ns, max_steps=MAX_STEPS, checkpoint_every=CHECKPOINT_EVERY)
    doc["spec"]["failurePolicy"] = {"backoffLimit": 0}
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
    log = output_dir(local_cluster, tiny.ns) / "train_log.jsonl"
    past = CHECKPOINT_EVERY + 2  # a step no periodic checkpoint saves
    wait_for(lambda: (_logged_steps(log) or [0])[-1] >= past, 480, f"rank 0 to log step {past}", interval=0.05)
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "tiny-cpu-1", "namespace": tiny.ns}}
    kube.create(f"/api/v1/namespaces/{tiny.ns}/pods/tiny-cpu-1/eviction", eviction)
    status = tiny.wait(lambda s: s.get("preemptions", 0) >= 1, "the preemption", name="tiny-cpu", timeout=240)
    assert status["restarts"] == 0 and "Preempted: " in status["lastPreemption"]["message"], status
    status = tiny.wait_state("Succeeded", name="tiny-cpu", timeout=780)
    assert (status["restarts"], status["preemptions"]) == (0, 1), status
    steps = _logged_steps(log)
    assert steps == list(range(1, MAX_STEPS + 1)), steps  # 0 steps lost, none taken twice
