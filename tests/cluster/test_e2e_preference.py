"""End to end: `kubectl apply` of a DPO job, two real ranks on the process node, through the operator.

examples/smollm2-dpo-cpu.yaml as it is (DPO with LoRA, the built-in secret-code pairs, two pods of
one CPU rank each), with the random tiny Llama in place of SmolLM2 and a few steps: the real model
takes tens of minutes of this machine's CPU (its measured run is in the example's header). The job
succeeds; the status carries the result; the train log holds every step's preference metrics, DPO's
start (policy = reference: loss log 2, margin 0, every held-out reward tied), a falling loss, and at
each evaluation the held-out preference accuracy and the greedy answers compared with the chosen ones.
A second test chains jobs: an SFT job, then a DPO job whose model.adapter is the SFT job's
status.result.adapterUri as the apiserver shows it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import PROCESS_NODE_PLACEMENT, Kube, LocalCluster
from finetune_localcluster.devtools import OperatorProcess, bind_claim, kubectl
from tests.cluster.operator_harness import Jobs, namespaces
from tests.cluster.process_jobs import CLAIM, output_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-dpo-cpu.yaml"
STEPS = 12
STEP_METRICS = {"loss", "rewards_chosen", "rewards_rejected", "reward_margin", "preference_accuracy"}
EVAL_METRICS = {"eval_loss", "eval_preference_accuracy", "eval_reward_margin", "exact_match", "examples"}


def tiny_dpo_job(namespace: str) -> dict[str, Any]:
    """The DPO example on the tiny model, placed on the process node, `STEPS` long."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    spec = doc["spec"]
    spec["model"]["uri"] = "builtin://tiny-llama"
    spec["dataset"]["maxSeqLength"] = 48
    spec["method"]["lora"].update({"r": 8, "alpha": 16})
    spec["training"].update(
        {"maxSteps": STEPS, "learningRate": 0.01, "evalEverySteps": STEPS, "checkpointEverySteps": STEPS}
    )
    spec["resources"].update(PROCESS_NODE_PLACEMENT)
    return doc


def test_a_dpo_job_trains_to_success_through_the_operator(
    kube: Kube, kubeconfig: Path, local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    with namespaces(kube, "t-e2e-dpo") as make:
        jobs = Jobs(kube, make(restricted=True))
        bind_claim(kube, jobs.ns, CLAIM)
        doc = tiny_dpo_job(jobs.ns)
        name = doc["metadata"]["name"]
        assert doc["spec"]["method"]["type"] == "dpo" and doc["spec"]["resources"]["numNodes"] == 2
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
        try:
            status = jobs.wait_state("Succeeded", name=name, timeout=780)
        except TimeoutError:
            print(jobs.describe(name), "\noperator log:", operator.log_tail())
            raise

        out = output_dir(local_cluster, jobs.ns, name)
        result = status["result"]
        assert result["steps"] == STEPS and result["adapterUri"] == f"pvc://{CLAIM}/{name}/adapter", result
        assert (out / "adapter" / "adapter_model.safetensors").is_file()
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
        trained = [e for e in log if "loss" in e]
        assert [e["step"] for e in trained] == list(range(1, STEPS + 1))
        assert all(e.keys() >= STEP_METRICS for e in trained), trained[0]
        assert trained[0]["loss"] == pytest.approx(math.log(2), abs=1e-5) and trained[0]["reward_margin"] == 0.0
        assert min(e["loss"] for e in trained[-3:]) < trained[0]["loss"], [e["loss"] for e in trained]

        evals = [e["eval"] for e in log if "eval" in e]
        assert len(evals) == 2 and all(e.keys() >= EVAL_METRICS for e in evals), evals
        before, after = evals
        assert (before["eval_preference_accuracy"], before["eval_reward_margin"]) == (0.0, 0.0), before
        assert before["eval_loss"] == pytest.approx(math.log(2), abs=1e-5)
        assert 0.0 <= after["eval_preference_accuracy"] <= 1.0 and after["eval_reward_margin"] != 0.0, after
        assert all(" " in e["expected"] for e in before["examples"]), before  # the chosen codes, 2 or 3 words
        assert (result["exactMatchBefore"], result["exactMatch"]) == (before["exact_match"], after["exact_match"])
        assert result["evalLossBefore"] == pytest.approx(before["eval_loss"])


def test_dpo_after_sft_starts_from_the_sft_jobs_result_uri(
    kube: Kube, kubeconfig: Path, local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    """The SFT job's `status.result.adapterUri`, taken as it is, is the DPO job's `model.adapter`: the
    claim it names is mounted, the adapter loads, and DPO compares against it (log 2, margin 0)."""
    with namespaces(kube, "t-e2e-sft-dpo") as make:
        jobs = Jobs(kube, make(restricted=True))
        bind_claim(kube, jobs.ns, CLAIM)
        sft = tiny_dpo_job(jobs.ns)
        sft["metadata"]["name"] = "sft-first"
        sft["spec"]["method"] = {"type": "lora", "lora": sft["spec"]["method"]["lora"]}
        sft["spec"]["dataset"].update({"uri": "builtin://secret-code", "format": "messages"})
        sft["spec"]["output"]["uri"] = f"pvc://{CLAIM}/sft-first"
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(sft))
        adapter = jobs.wait_state("Succeeded", name="sft-first", timeout=600)["result"]["adapterUri"]
        assert adapter == f"pvc://{CLAIM}/sft-first/adapter"

        dpo = tiny_dpo_job(jobs.ns)
        dpo["metadata"]["name"] = "dpo-second"
        dpo["spec"]["model"]["adapter"] = adapter
        dpo["spec"]["output"]["uri"] = f"pvc://{CLAIM}/dpo-second"
        dpo["spec"]["training"].update(
            {"maxSteps": 4, "evalEverySteps": 4, "checkpointEverySteps": 4, "learningRate": 0.0001}
        )
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(dpo))
        try:
            status = jobs.wait_state("Succeeded", name="dpo-second", timeout=600)
        except TimeoutError:
            print(jobs.describe("dpo-second"), "\noperator log:", operator.log_tail())
            raise
        assert status["result"]["adapterUri"] == f"pvc://{CLAIM}/dpo-second/adapter", status["result"]
        out = output_dir(local_cluster, jobs.ns, "dpo-second")
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
        first = next(e for e in log if "loss" in e)
        assert first["loss"] == pytest.approx(math.log(2), abs=1e-5) and first["reward_margin"] == 0.0, first
        # the SFT adapter is what it trained on: after 4 small steps its lora_A matrices are still the SFT job's,
        # nearly (a new adapter's are drawn at random: about sqrt(2) times their norm away)
        from safetensors.torch import load_file

        sft_weights = load_file(
            output_dir(local_cluster, jobs.ns, "sft-first") / "adapter" / "adapter_model.safetensors"
        )
        dpo_weights = load_file(out / "adapter" / "adapter_model.safetensors")
        lora_a = [key for key in sft_weights if "lora_A" in key]
        assert lora_a and set(lora_a) <= dpo_weights.keys()
        moved = max(float((dpo_weights[k] - sft_weights[k]).norm() / sft_weights[k].norm()) for k in lora_a)
        assert moved < 0.1, moved
