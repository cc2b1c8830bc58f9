"""Rank-0-only work that outlasts the collective timeout does not kill the gang.

Two real gloo ranks, started by the real node launcher, with a collective timeout of a few
seconds (as 30 minutes are to a ~30B model's conversion): rank 0 converts a checkpoint for the
new strategy (slowed down by FTJOB_FAULT_SLOW at `universal.ensure`'s fault point, far past the
timeout) while rank 1 waits. Rank 1 used to wait in an all-reduce and failed with gloo's
timeout; NCCL's watchdog aborts the same wait on a GPU. Then rank 0's work fails outright: the
waiting rank learns it from the store and raises, instead of hanging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_localcluster.ports import free_port
from finetune_trainer.pod.launch import world_info

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

TIMEOUT_S = 8
SLOW_S = 3 * TIMEOUT_S

RANK = """
import json, os, sys, time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from finetune_trainer import leader_work
from finetune_trainer.checkpoint import universal

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=timedelta(seconds=float(sys.argv[2])))


class Dist:  # the loop's collective (`loop.Dist`) over torch.distributed: rank and an all-reduce sum
    rank = dist.get_rank()

    def sum(self, values):
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)
        return tensor.tolist()


report = {}
began = time.monotonic()
report["converted"] = str(universal.ensure(Path(sys.argv[1]), Dist()))
report["seconds"] = time.monotonic() - began


def fail():
    raise RuntimeError("the export's disk is gone")


try:
    leader_work.run(fail, doer=rank == 0, doers=1, what="writing the trained model")
except Exception as exc:
    report["failed"] = f"{type(exc).__name__}: {exc}"
Path(sys.argv[3] + str(rank)).write_text(json.dumps(report))
if rank == 0:  # rank 0 hosts the store: the other rank reads the failure before it goes
    time.sleep(3)
"""


def test_a_conversion_longer_than_the_collective_timeout_completes(tmp_path: Path) -> None:
    step = tmp_path / "checkpoints" / "step-00000003"
    (tmp_path / "checkpoints" / "step-00000003_universal").mkdir(parents=True)  # converted on an earlier start
    step.mkdir()
    (tmp_path / "rank_script.py").write_text(RANK)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}",
        "FTJOB_LAUNCHER_PRELOAD": "none",
        "OMP_NUM_THREADS": "1",
        "FTJOB_FAULT_SLOW": "convert:3",
        "FTJOB_FAULT_SLOW_SECONDS": str(SLOW_S),
    }
    world = world_info((("127.0.0.1", 2),))
    args = [f"--world_info={world}", "--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    report = tmp_path / "report"
    args += ["rank_script", str(step), str(TIMEOUT_S), str(report)]
    done = subprocess.run(
        [sys.executable, "-m", "finetune_trainer.pod.node_launcher", *args],
        env=env,
        timeout=240,
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report{rank}").read_text()) for rank in (0, 1)]
    for rank, seen in enumerate(reports):
        assert seen["converted"] == str(step.with_name(step.name + "_universal")), (rank, seen)
        assert seen["seconds"] >= SLOW_S, "the conversion was slowed past the collective timeout"
    assert reports[0]["failed"] == "RuntimeError: the export's disk is gone"
    assert reports[1]["failed"] == "LeaderWorkFailed: writing the trained model: failed on another rank (see its log)"
