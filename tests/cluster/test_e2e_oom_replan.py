"""End to end: a real out-of-memory error under ZeRO-2 re-plans the job to ZeRO-3, and the new
gang resumes from the checkpoint the old one wrote.

Real ranks on the process node (see test_e2e_tiny_job.py): the trainer raises a real
`torch.OutOfMemoryError` at step 12 (`FTJOB_FAULT_OOM`, once per rank: the marker is kept on
the claim), after the step-8 checkpoint. The operator reads it from the termination log,
moves to the next rung of the re-plan ladder and rolls the gang; the new ranks convert the
checkpoint to ZeRO-3 and finish. A second job, pinned to that strategy, trains from a copy
of the same checkpoint without interruption; both adapters must be the same.

The ladder has to reach ZeRO-3 from ZeRO-2: the job pins everything but the ZeRO stage
(offload none, checkpointing on, micro-batch 8), shrinks DeepSpeed's buckets so ZeRO-3's
buffers no longer outweigh its savings on a model this small, and declares a GPU (here a CPU
rank) just large enough for ZeRO-2, so ZeRO-0 and ZeRO-1 do not fit. The test asks the
planner for that size instead of hard-coding bytes.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import PROCESS_NODE_PLACEMENT, Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim, kubectl
from finetune_operator.api.job import FineTuneJob
from finetune_operator.plan import plan_job
from finetune_operator.plan.workload import DEFAULT_FIT_MARGIN
from tests.cluster.operator_harness import Jobs
from tests.cluster.process_jobs import CLAIM, assert_same_adapter, output_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
MAX_STEPS, CHECKPOINT_EVERY, OOM_AT = 16, 8, 12
SMALL_BUCKETS = {
    "zero_optimization.reduce_bucket_size": 100000,
    "zero_optimization.stage3_prefetch_bucket_size": 100000,
}

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def job_doc(name: str, namespace: str, zero_stage: int | str, gpu_memory: int | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    spec = doc["spec"]
    spec["training"].update(
        {
            "maxSteps": MAX_STEPS,
            "checkpointEverySteps": CHECKPOINT_EVERY,
            "checkpointsToKeep": 3,
            "evalEverySteps": MAX_STEPS,
            "gradientCheckpointing": "true",
        }
    )
    spec["deepspeed"] = {
        "zeroStage": zero_stage,
        "offloadOptimizer": "none",
        "offloadParams": "none",
        "overrides": SMALL_BUCKETS,
    }
    spec["resources"].update(PROCESS_NODE_PLACEMENT)
    if gpu_memory is not None:
        spec["resources"]["gpuMemory"] = gpu_memory
    spec["output"]["uri"] = f"pvc://{CLAIM}/{name}"
    return doc


def memory_for_zero2(doc: dict[str, Any]) -> int:
    """A per-rank memory in which ZeRO-2 is the least sharding that fits (ZeRO-0 and -1 do not)."""
    result = plan_job(FineTuneJob.from_manifest(doc).spec, require_fit=False)
    need = {c.strategy.zero_stage: c.per_gpu_bytes for c in result.candidates}
    assert need[3] < need[2] < min(need[0], need[1]), need  # else the ladder cannot go 2 -> 3
    return math.ceil(need[2] / DEFAULT_FIT_MARGIN) + 1


@pytest.fixture
def jobs(kube: Kube, restricted_namespace: str, operator: OperatorProcess) -> Jobs:
    bind_claim(kube, restricted_namespace, CLAIM)
    return Jobs(kube, restricted_namespace)


def logs(cluster: LocalCluster, namespace: str, pod: str, containing: str) -> str | None:
    """The log of an incarnation of `pod` that contains `containing`. Read where the process node
    keeps it, which outlives the pod: a short resumed run succeeds and its pods are deleted
    seconds after the line, too soon for a poll of `kubectl logs` to be sure to see it."""
    for path in sorted(cluster.workdir.glob(f"process-node-*/pods/{namespace}_{pod}_*/trainer.log")):
        text = path.read_text(errors="replace")
        if containing in text:
            return text
    return None


def test_out_of_memory_replans_to_zero3_and_resumes(jobs: Jobs, kubeconfig: Path, local_cluster: LocalCluster) -> None:
    ns = jobs.ns
    probe = job_doc("oom", ns, "auto")
    gpu_memory = memory_for_zero2(probe)
    doc = job_doc("oom", ns, "auto", gpu_memory)
    doc["spec"]["env"] = [{"name": "FTJOB_FAULT_OOM", "value": f"step:{OOM_AT}"}]
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
    first = jobs.wait(lambda s: bool(s.get("plan")), "a plan", name="oom", timeout=60)["plan"]
    assert (first["zeroStage"], first["offloadOptimizer"], first["microBatchSize"]) == (2, "none", 8), first

    status = jobs.wait(lambda s: (s.get("plan") or {}).get("replans") == 1, "the re-plan", name="oom", timeout=480)
    plan = status["plan"]
    assert (plan["zeroStage"], plan["offloadOptimizer"], plan["offloadParams"]) == (3, "none", "none"), plan
    assert status["lastFailure"]["reason"] == "OutOfMemory", status["lastFailure"]
    assert f"injected by FTJOB_FAULT_OOM=step:{OOM_AT}" in status["lastFailure"]["message"]

    written_by = f"resumed from step {CHECKPOINT_EVERY} written by ZeRO-2"
    log = wait_for(lambda: logs(local_cluster, ns, "oom-0", containing=written_by), 300,
                   "the new gang to resume from the step-8 checkpoint")  # fmt: skip
    assert "now ZeRO-3" in log and "re-partitioned for the new strategy" in log, log[-3000:]

    status = jobs.wait_state("Succeeded", name="oom", timeout=480)
    got_result = status["result"]
    assert status["restarts"] == 1, f"more than the one re-plan restart: {status.get('lastFailure')}"
    assert status["result"]["steps"] == MAX_STEPS
    progress = status["progress"]
    assert (progress["resumedFromStep"], progress["checkpointConverted"]) == (CHECKPOINT_EVERY, True), progress
    jobs.wait_events({"OutOfMemoryReplanned", "ResumedFromCheckpoint"}, name="oom")
    events = {e["reason"]: e["message"] for e in jobs.events("oom")}
    assert "converted to the new strategy" in events["OutOfMemoryReplanned"], events
    assert events["ResumedFromCheckpoint"] == (
        f"rank 0 resumed from the step-{CHECKPOINT_EVERY} checkpoint under ZeRO-3, micro-batch 8 x accumulation 1, "
        "gradient checkpointing; it was written under another strategy and converted"
    ), events

    # The reference: the new strategy, pinned, from a copy of the same checkpoint, uninterrupted.
    out = output_dir(local_cluster, ns, "oom")
    reference_out = output_dir(local_cluster, ns, "reference")
    checkpoint = out / "checkpoints" / f"step-{CHECKPOINT_EVERY:08d}"
    shutil.copytree(checkpoint, reference_out / "checkpoints" / checkpoint.name)
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(job_doc("reference", ns, 3, gpu_memory)))
    status = jobs.wait_state("Succeeded", name="reference", timeout=480)
    assert status["restarts"] == 0 and status["plan"]["replans"] == 0
    progress = status["progress"]
    assert (progress["resumedFromStep"], progress["checkpointConverted"]) == (CHECKPOINT_EVERY, True), progress
    assert logs(local_cluster, ns, "reference-0", containing=written_by)

    # Same checkpoint, strategy, world size, data position and RNG state: the same float
    # operations in the same order on CPU (gloo sums two ranks in a fixed order), so the
    # adapters are expected bit for bit equal (measured: max difference 0.0). The slack, 1e-6
    # absolute on fp32 weights below 0.1, only absorbs summation-order noise: Adam moves a weight
    # by up to about the learning rate per step, and the run's lowest is 1.1e-5 (step 16), so a
    # skipped, repeated or lost step, or another starting state, is well outside it.
    assert got_result["finalLoss"] == pytest.approx(status["result"]["finalLoss"], rel=1e-6)
    assert_same_adapter(out, reference_out)
