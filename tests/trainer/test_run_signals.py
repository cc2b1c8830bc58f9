"""`ftjob run` stopped by a signal stops the launcher and every rank, not just itself (once the
ranks have saved the step they stopped at: a SIGTERM is a preemption, see `preemption`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from finetune_localcluster.ports import free_port
from finetune_trainer.pod.node_launcher import PRELOAD_ENV
from tests.support.training_runs import REPO, job_manifest, wait_for

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def _alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
        except psutil.NoSuchProcess:
            continue
    return left


@pytest.mark.timeout(300)
@pytest.mark.parametrize("preload", ["forked", "none"], ids=["forked-ranks", "fresh-ranks"])
def test_sigterm_to_ftjob_run_stops_the_launcher_and_every_rank(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, preload: str
) -> None:
    """With ranks forked from the launcher (a CPU node's default) and started afresh (a GPU node's way)."""
    signum = signal.SIGTERM
    out = tmp_path / "out"
    manifest = job_manifest(
        str(tiny_model_dir), str(reverse_jsonl), str(out), training={"maxSteps": 100000, "checkpointEverySteps": 100000}
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "FTJOB_METRICS_PORT": "off"}
    env.update({"PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", "FTJOB_STOP_GRACE_SECONDS": "90"})
    env.pop(PRELOAD_ENV, None)
    if preload == "none":
        env[PRELOAD_ENV] = "none"
    cmd = [sys.executable, "-m", "finetune_operator.cli.main", "run", str(job_file), "--no-progress"]
    cmd += ["--master-port", str(free_port())]
    log = tmp_path / "run.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    descendants: set[int] = set()
    try:
        train_log = out / "train_log.jsonl"

        def training() -> bool:
            descendants.update(p.pid for p in psutil.Process(proc.pid).children(recursive=True))
            return train_log.exists() and '"loss"' in train_log.read_text()

        assert wait_for(training, timeout=240, interval=0.5), log.read_text()[-3000:]
        descendants.update(p.pid for p in psutil.Process(proc.pid).children(recursive=True))
        assert len(descendants) >= 3, descendants  # the node launcher and two ranks
        proc.send_signal(signum)
        code = proc.wait(timeout=150)
        assert wait_for(lambda: not _alive(descendants), timeout=30), f"still running: {_alive(descendants)}"
    finally:
        for pid in _alive(descendants | {proc.pid}):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    assert code == 128 + signum, log.read_text()[-3000:]
    text = log.read_text()
    assert "stopped: Preempted: asked to stop (SIGTERM); stopped at the boundary of step" in text, text[-3000:]
    assert list((out / "checkpoints").glob("step-*")), "the step it stopped at is saved"
