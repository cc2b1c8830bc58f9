"""End to end: a job with `spec.serving` trains to success through the operator, and the
operator applies its InferenceService into an apiserver that has KServe's real CRDs (v0.16.0).

The tiny demo job (examples/tiny-cpu.yaml, six steps) exports its merged model; while it trains,
`FineTuneClient.serve` asks for it to be served (`serving.model: merged`: the tiny random model
exists only in the trainer, so there is no base a runtime could load an adapter onto), which
does not restart the gang. An InferenceService of the same name that the job did not make is in
the way: the job still succeeds, the `Serving` condition says why nothing was applied, and once
that object is gone `ftjob serve --wait` returns when the operator's retry has applied its own. The
served object names the merged model's `pvc://` URI from `status.result`, is not owned by the
job, and outlives it. KServe's controllers do not run here, so nothing serves the model (a real
vLLM serving a trained adapter: tests/images/test_vllm_serving.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from finetune_localcluster import Kube, KubeError, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim, kubectl
from finetune_localcluster.kserve import install
from finetune_operator.client import FineTuneClient
from tests.cluster.operator_harness import Jobs, namespaces
from tests.cluster.process_jobs import CLAIM, tiny_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices"


def test_a_succeeded_job_is_served_and_its_inference_service_outlives_it(
    kube: Kube, kubeconfig: Path, local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    install(kube)
    with namespaces(kube, "t-serve") as make:
        jobs = Jobs(kube, make(restricted=True))
        ns = jobs.ns
        bind_claim(kube, ns, CLAIM)
        doc = tiny_job(ns, max_steps=6, checkpoint_every=6)
        name = doc["metadata"]["name"]
        doc["spec"]["output"]["mergedModel"] = True
        foreign = {  # someone's InferenceService of the name the job serves under
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"}, "storageUri": "hf://a/b"}}},
        }
        kube.create(ISVC.format(ns=ns), foreign)
        kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(doc))
        jobs.wait_state("Running", name=name, timeout=300)
        # asked for while it trains, through the SDK: the gang is not restarted for it
        with FineTuneClient(ns, kubeconfig=kubeconfig) as client:
            client.serve(name, "InferenceService", model="merged", gpus=0)
        try:
            status = jobs.wait(
                lambda s: any(c["type"] == "Serving" for c in s.get("conditions", [])), "a Serving condition", name, 600
            )
        except TimeoutError:
            print(jobs.describe(name), "\noperator log:", operator.log_tail())
            raise
        serving = next(c for c in status["conditions"] if c["type"] == "Serving")
        assert status["state"] == "Succeeded" and status["restarts"] == 0, status
        assert (serving["status"], serving["reason"]) == ("False", "ServingNotApplied"), serving
        assert "not applied for this job" in serving["message"], serving
        assert kube.get(f"{ISVC.format(ns=ns)}/{name}")["spec"]["predictor"]["model"]["storageUri"] == "hf://a/b"

        kube.delete(f"{ISVC.format(ns=ns)}/{name}")  # out of the way: the operator's retry (30 s) applies its own
        served_cli = subprocess.run(
            [sys.executable, "-m", "finetune_operator.cli.main", "serve", name, "--target", "InferenceService",
             "--model", "merged", "--gpus", "0", "--wait", "2m", "--namespace", ns, "--kubeconfig", str(kubeconfig)],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert served_cli.returncode == 0, served_cli.stderr
        assert f"InferenceService/{name} serves the merged" in served_cli.stdout, served_cli.stdout
        assert f"http://{name}-predictor.{ns}.svc.cluster.local/openai/v1" in served_cli.stdout
        status = jobs.status(name)
        served = kube.get(f"{ISVC.format(ns=ns)}/{name}")
        merged = status["result"]["mergedModelUri"]
        assert merged == f"pvc://{CLAIM}/{name}/merged", status["result"]
        assert served["spec"]["predictor"]["model"]["storageUri"] == merged
        assert "ownerReferences" not in served["metadata"]
        assert served["metadata"]["labels"]["finetune.dev/served-job"] == name
        assert status["serving"]["objects"] == [{"kind": "InferenceService", "name": name}]
        assert (status["serving"]["served"], status["serving"]["modelName"]) == ("merged", name)
        condition = next(c for c in status["conditions"] if c["type"] == "Serving")
        assert (condition["status"], condition["reason"]) == ("True", "ServingApplied"), condition

        kube.delete(f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs/{name}")
        job_path = f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs/{name}"
        wait_for(lambda: kube.get_or_none(job_path) is None, 60, "the job to be deleted")
        time.sleep(3)  # the garbage collector had its chance: the served object stays
        try:
            kept = kube.get(f"{ISVC.format(ns=ns)}/{name}")
        except KubeError as exc:
            pytest.fail(f"the InferenceService went with the job: {exc}")
        assert kept["metadata"]["uid"] == served["metadata"]["uid"]
