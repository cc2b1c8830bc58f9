"""Helpers for running the trainer as its pod does: a job's manifest and config files, and
`ftjob train --config DIR` started in its own process group (the node launcher and real
DeepSpeed gloo ranks on this CPU). The trainer and Prometheus tiers and two benchmarks use
them; the trainer tier's fixtures (a tiny model, datasets, `runs`/`launch`) are in its conftest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_localcluster.kube import wait_scale
from finetune_localcluster.ports import free_port
from tests.support import fork_server

REPO = fork_server.REPO


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def job_manifest(model_uri: str, dataset_uri: str, output_uri: str, **spec: Any) -> dict[str, Any]:
    """A FineTuneJob manifest with small defaults; `spec` entries replace top-level spec keys."""
    base: dict[str, Any] = {
        "model": {"uri": model_uri},
        "dataset": {"uri": dataset_uri, "format": "alpaca", "maxSeqLength": 64, "validationSplit": 0.05},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        "training": {
            "maxSteps": 4,
            "microBatchSize": 2,
            "globalBatchSize": 4,
            "learningRate": 0.001,
            "checkpointEverySteps": 100,
            "precision": "fp32",
            "warmupRatio": 0.0,
        },
        "resources": {"numNodes": 2, "gpusPerNode": 0},
        "deepspeed": {"zeroStage": 2},
        "output": {"uri": output_uri},
    }
    for key, value in spec.items():
        merge = isinstance(value, dict) and key != "method"  # a method block replaces the default one
        base[key] = {**base.get(key, {}), **value} if merge else value
    return {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "t"}, "spec": base}


def link_model_cache(out: Path, model_dir: Path) -> None:
    """Where the trainer looks for built-in models (`<output>/.cache`), pointing at a converted one."""
    (out / ".cache").mkdir(parents=True, exist_ok=True)
    (out / ".cache" / model_dir.name).symlink_to(model_dir)


def render_config(directory: Path, manifest: dict[str, Any], hostfile: str | None = None) -> Path:
    """The operator's config files, under the fixed plan: the tests pin their strategy explicitly."""
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import fixed_plan
    from finetune_operator.render.config_files import config_files

    job = FineTuneJob.from_manifest(manifest)
    world = job.spec.resources.world_size
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in config_files(job, fixed_plan(job.spec), hostfile or f"localhost slots={world}\n").items():
        (directory / name).write_text(content)
    return directory


SHARED_ENV = {
    "DS_ACCELERATOR": "cpu",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}
"""What every run's environment adds to the test process's: the fork server's too."""
FORK_STATUS_DIR = Path(tempfile.gettempdir()) / "ftjob-test-fork-server"


@dataclass
class Run:
    proc: subprocess.Popen[str] | fork_server.ForkedRun
    output: Path
    termination_log: Path
    log_file: Path
    port: int

    def wait(self, timeout: float) -> int:
        """The run's exit code, waiting at most `timeout` seconds (times `wait_scale()`)."""
        try:
            return self.proc.wait(timeout=timeout * wait_scale())
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def termination(self) -> str:
        return self.termination_log.read_text() if self.termination_log.exists() else ""

    def summary(self) -> dict[str, Any]:
        return dict(json.loads(self.termination()))

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    @property
    def collective_dir(self) -> Path:
        return self.output.parent / f"{self.termination_log.name}-collectives"

    def collective_reports(self) -> dict[int, dict[str, Any]]:
        """Each rank's collective-device report (finetune_trainer.rank.collective_check), by rank."""
        reports = [json.loads(p.read_text()) for p in sorted(self.collective_dir.glob("rank-*.json"))]
        return {int(r["rank"]): r for r in reports}

    def train_log(self) -> list[dict[str, Any]]:
        path = self.output / "train_log.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def losses(self) -> dict[int, float]:
        """Loss per step; the last record of a step wins (a resumed run rewrites the steps it redoes)."""
        return {e["step"]: e["loss"] for e in self.train_log() if "loss" in e}


def start_train(
    config_dir: Path,
    output: Path,
    *,
    env: dict[str, str] | None = None,
    port: int | None = None,
    tag: str = "run",
    fresh: bool = False,
) -> Run:
    """Start `ftjob train --config DIR` in its own process group: forked from this test process's
    fork server (tests/support/fork_server.py) as the `python -m finetune_trainer --config DIR` it
    execs, when the run's environment allows, else (or with `fresh`) as a fresh interpreter."""
    termination = output.parent / f"{output.name}-{tag}-termination-log"
    log_file = output.parent / f"{output.name}-{tag}.log"
    port = port or free_port()
    base = dict(os.environ)
    base.update(SHARED_ENV)
    full_env = dict(base)
    full_env.update(
        {
            "FTJOB_OUTPUT_DIR": str(output),
            "FTJOB_TERMINATION_LOG": str(termination),
            "FTJOB_METRICS_PORT": "off",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "NODE_RANK": "0",
            "FTJOB_DIST_TIMEOUT_MINUTES": "3",
            # every tensor a rank hands to a collective must be on its device (NCCL has no host tensors)
            "FTJOB_CHECK_COLLECTIVE_DEVICES": str(termination.parent / f"{termination.name}-collectives"),
        }
    )
    full_env.update(env or {})
    args = ["train", "--config", str(config_dir)]
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text("")
    # the server is started with `base`: a run that differs from it in an import-time variable
    # starts fresh, and does not start a server it cannot use
    forkable = not fresh and not fork_server.differs(base, full_env)
    server = fork_server.server_for(base, FORK_STATUS_DIR / str(os.getpid())) if forkable else None
    if server is not None and not fork_server.differs(server.env, full_env):
        # `ftjob train` execs `python -m finetune_trainer --config DIR`: forked here as that module
        forked = server.start(fork_server.TRAINER_MODULE, args[1:], full_env, REPO, log_file)
        return Run(forked, output, termination, log_file, port)
    with log_file.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", fork_server.CLI_MODULE, *args],
            env=full_env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            cwd=REPO,
        )
    return Run(proc, output, termination, log_file, port)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


METHODS = {
    "lora": {"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
    "qlora": {"type": "qlora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}, "qlora": {"quantType": "nf4"}},
    "full": {"type": "full"},
}
"""The three methods as `spec.method` values, for tests that run each."""


def adapter_tensors(folder: Path) -> dict[str, Any]:
    """Every tensor of the safetensors files in `folder` (an adapter or a model folder)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(f))
    return out


def qlora_model(model_dir: Path) -> Any:
    """The trainer's QLoRA model of `model_dir` (bf16 compute, r=8) on CPU, its LoRA B made non-zero."""
    import torch

    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import fixed_plan
    from finetune_trainer.model import modeling

    manifest = job_manifest(
        str(model_dir), "/unused.jsonl", "/out", method=METHODS["qlora"], training={"precision": "bf16"}
    )
    spec = FineTuneJob.from_manifest(manifest).spec
    torch.manual_seed(0)
    model = modeling.load_model(spec, fixed_plan(spec), str(model_dir), modeling.compute_settings(spec, False))
    with torch.no_grad():  # a LoRA B of zeros would hide what flows back through the base
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    return model
