"""`python -m tools.demo`: what a user sees on a real GPU cluster, on this CPU-only machine.

It starts the local control plane (etcd, kube-apiserver, controller-manager, scheduler,
one kwok GPU node and one process node that really runs pods), installs the Helm chart,
runs the operator with the chart's ServiceAccount credentials, applies
examples/smollm2-cpu.yaml (a real pretrained model, SmolLM2-135M-Instruct, learning a
made-up word-for-word code; `--example examples/tiny-cpu.yaml` for a random tiny Llama
learning to reverse word lists, faster; `--example examples/smollm2-dpo-cpu.yaml` for DPO on the
same code's preference pairs, printing the held-out preference accuracy before and after), shows
`kubectl get ftj -w`-style progress while two real DeepSpeed ranks train on the process
node, prints the result, the model's answers to held-out prompts before and after with
their exact-match accuracy, and the plan, and stops everything it started. With `--mlflow` it also
starts a real MLflow server on loopback, makes it the chart's default tracking server, and shows
the job's run (its URL, params, metrics and artifacts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster import PROCESS_NODE_PLACEMENT, LocalCluster
from finetune_localcluster.binaries import ensure_binaries
from finetune_localcluster.devtools import OperatorProcess, bind_claim, helm, install_crd, service_account_kubeconfig
from finetune_operator.api.status import PlanStatus
from finetune_operator.api.strategy import Strategy
from tools.demo import prepare

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2-cpu.yaml"
SYSTEM_NS, JOB_NS = "ftjob-system", "ml-demo"
CHART, RELEASE, CLAIM = REPO / "charts" / "finetune-operator", "ftjob", "ftjob-output"


def say(text: str) -> None:
    print(f"\n\033[1m{text}\033[0m", flush=True)


def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    kubectl_bin = str(ensure_binaries().kubectl)
    done = subprocess.run([kubectl_bin, "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout


def watch(cluster: LocalCluster, name: str, timeout: float) -> dict[str, Any]:
    """Print the `kubectl get ftj` row whenever it changes; return the final status."""
    kube = cluster.kube()
    path = f"/apis/finetune.dev/v1alpha1/namespaces/{JOB_NS}/finetunejobs/{name}"
    header_done, last, deadline = False, "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = kubectl(cluster, "get", "ftj", "-n", JOB_NS).splitlines()
        if not header_done:
            print(table[0], flush=True)
            header_done = True
        row = table[1] if len(table) > 1 else ""
        changing = " ".join(row.split()[:-1])  # ignore the AGE column
        if changing != last:
            print(row, flush=True)
            last = changing
        status: dict[str, Any] = kube.get(path).get("status") or {}
        if status.get("state") in ("Succeeded", "Failed"):
            return status
        time.sleep(2)
    raise TimeoutError(f"the demo job did not finish in {timeout:.0f}s")


def print_answers(train_log: Path) -> None:
    """The held-out prompts' expected answers and what the model said, before and after training."""
    try:
        evals = [e["eval"] for e in map(json.loads, train_log.read_text().splitlines()) if "eval" in e]
    except FileNotFoundError:
        return
    if len(evals) < 2:
        return
    first, last = evals[0], evals[-1]
    pairs = "eval_preference_accuracy" in first
    if pairs:
        tie = " (its rewards all tie at 0: the policy is its reference)" if first["eval_reward_margin"] == 0 else ""
        print(f"\nheld-out pairs: the policy prefers chosen over rejected in {first['eval_preference_accuracy']:.0%} "
              f"before{tie}, {last['eval_preference_accuracy']:.0%} after; reward margin "
              f"{first['eval_reward_margin']:.2f} before, {last['eval_reward_margin']:.2f} after")  # fmt: skip
    if "examples" not in first:
        return
    print(f"\nheld-out prompts: exact match {first['exact_match']:.0%} before, {last['exact_match']:.0%} after")
    print(f"  {'expected (chosen)' if pairs else 'expected':28} {'before training':34} after training")
    for before, after in zip(first["examples"], last["examples"], strict=False):
        print(f"  {before['expected']:28} {before['got'][:32]:34} {after['got'][:32]}")


def show_run(tracking: dict[str, Any], url: str | None) -> None:
    """The job's MLflow run: its URL and, from our own server, what it holds."""
    print(f"\nMLflow run: {tracking['runUrl']}")
    if not url:
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    run = client.get_run(tracking["runId"])
    print(f"  status {run.info.status}; params: {', '.join(f'{k}={v}' for k, v in sorted(run.data.params.items()))}")
    counts = {key: len(client.get_metric_history(run.info.run_id, key)) for key in sorted(run.data.metrics)}
    print(f"  metrics (points): {', '.join(f'{k} ({n})' for k, n in counts.items())}")
    folders: list[str | None] = [None]
    files: list[str] = []
    while folders:
        for item in client.list_artifacts(run.info.run_id, folders.pop()):
            (folders if item.is_dir else files).append(item.path)
    print(f"  artifacts: {', '.join(sorted(files))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=REPO / ".work" / "demo")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--example", type=Path, default=EXAMPLE, help="the FineTuneJob to apply")
    parser.add_argument("--mlflow", action="store_true", help="track the job in a local MLflow server, show its run")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    say("1. Kubernetes binaries (built from Go modules once, then cached)")
    bins = ensure_binaries()
    print(f"   {bins.kube_bin}")
    say("2. Local control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok GPU node, process node")
    started = time.monotonic()
    with (
        LocalCluster(args.workdir / "cluster", gpu_nodes=1, process_nodes=1) as cluster,
        contextlib.ExitStack() as stack,
    ):
        print(f"   up in {time.monotonic() - started:.1f}s; KUBECONFIG={cluster.kubeconfig}")
        print(kubectl(cluster, "get", "nodes", "-L", "nvidia.com/gpu.product"), end="")
        kube = cluster.kube()
        for ns in (SYSTEM_NS, JOB_NS):
            kube.create("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted"}}})  # fmt: skip

        tracking: tuple[str, ...] = ()
        if args.mlflow:
            from finetune_localcluster.mlflow_server import MlflowServer

            url = stack.enter_context(MlflowServer(args.workdir / "mlflow")).url
            say(f"2a. MLflow tracking server (PyPI's mlflow, sqlite store) on loopback: {url}")
            tracking = ("--set", f"tracking.mlflow.trackingUri={url}")
        say(f"3. helm install {RELEASE} charts/finetune-operator -n {SYSTEM_NS} {' '.join(tracking)}".rstrip())
        print(helm(cluster.kubeconfig, "install", RELEASE, str(CHART), "--namespace", SYSTEM_NS, *tracking), end="")
        install_crd(kube)

        say("4. The operator, with the chart's ServiceAccount credentials (not admin)")
        deployment = kube.get(f"/apis/apps/v1/namespaces/{SYSTEM_NS}/deployments/{RELEASE}-finetune-operator")
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        config = service_account_kubeconfig(kube, cluster, SYSTEM_NS, sa, args.workdir / "operator.kubeconfig")
        default_uri = ("--default-tracking-uri", tracking[1].split("=", 1)[1]) if tracking else ()
        operator = OperatorProcess(config, args.workdir / "operator.log", extra_args=default_uri)
        operator.start()
        print(f"   running as system:serviceaccount:{SYSTEM_NS}:{sa}; log {operator.log_path}")
        try:
            doc = yaml.safe_load(args.example.read_text())
            name = doc["metadata"]["name"]
            kind = str(doc["spec"]["method"]["type"])
            method, model = {"lora": "LoRA", "qlora": "QLoRA"}.get(kind, kind.upper()), doc["spec"]["model"]["uri"]
            say(f"5. kubectl apply -f {args.example.name}  (2 pods × 1 CPU rank, {method}, {model})")
            bind_claim(kube, JOB_NS, CLAIM)
            if doc["spec"]["model"]["uri"] == f"builtin://{prepare.SMOLLM2}" and prepare.seed_output_cache(
                cluster.workdir / "pvc" / JOB_NS / CLAIM / name
            ):
                print(f"   (the converted model comes from {prepare.converted_models()}: scripts/demo.sh prepares it)")
            doc["metadata"]["namespace"] = JOB_NS
            doc["spec"]["resources"].update(PROCESS_NODE_PLACEMENT)
            print(kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(doc)), end="")

            say("6. kubectl get ftj -n ml-demo -w")
            status = watch(cluster, name, args.timeout)

            say("7. Result")
            print(json.dumps(status.get("result", {}), indent=2))
            print_answers(cluster.workdir / "pvc" / JOB_NS / CLAIM / name / "train_log.jsonl")
            run = (status.get("result") or {}).get("tracking") or {}
            if run.get("runUrl"):
                show_run(run, default_uri[1] if default_uri else None)
            if status.get("plan"):
                plan = PlanStatus.from_wire(status["plan"])
                print(f"\nplan: {Strategy.from_plan(plan)}")
                print(f"why:  {plan.reason}")
            adapter = cluster.workdir / "pvc" / JOB_NS / CLAIM / name / "adapter"
            with contextlib.suppress(FileNotFoundError):
                files = sorted(p.name for p in adapter.iterdir())
                print(f"adapter on the output claim: {adapter}\n  {', '.join(files)}")
            print("\nevents:")
            print(kubectl(cluster, "get", "events", "-n", JOB_NS, "--field-selector",
                          "involvedObject.kind=FineTuneJob", "-o",
                          "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message"), end="")  # fmt: skip
            return 0 if status.get("state") == "Succeeded" else 1
        finally:
            say("8. Stopping the operator and the cluster")
            operator.stop()


if __name__ == "__main__":
    sys.exit(main())
