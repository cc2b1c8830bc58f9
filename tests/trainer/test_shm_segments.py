"""DeepSpeed's CPU shm all-reduce segments: which names a job owns, and that a real run leaves none."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from finetune_localcluster.ports import free_port
from finetune_trainer.shm_segments import SHM_DIR, job_prefix, port_in_use, release_own, sweep
from tests.support.training_runs import Run, job_manifest, render_config, wait_for

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]


def _segments(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes(b"x")


def test_sweep_removes_only_this_jobs_segments(tmp_path: Path) -> None:
    uid, port = os.getuid(), free_port()
    mine = [f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_{r}" for r in (0, 1, 11)]
    others = [
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port // 10}_0",  # another port that is a prefix of this one
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}1_0",
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.2_{port}_0",  # another master address
        f"deepspeed_allreduce_buffer_{uid + 1}_127.0.0.1_{port}_0",  # another user's job
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_x",
        "psm_something_else",
    ]
    _segments(tmp_path, *mine, *others)
    assert sweep("127.0.0.1", port, shm_dir=tmp_path) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert sweep("127.0.0.1", port, shm_dir=tmp_path) == []
    assert sweep("127.0.0.1", port, shm_dir=tmp_path / "absent") == []


def test_sweep_leaves_a_live_runs_segments_and_older_ones(tmp_path: Path) -> None:
    """While a process listens on the port (a live run's rendezvous store), its names are not ours."""
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        live = [f"{job_prefix('127.0.0.1', port)}{r}" for r in (0, 1)]
        _segments(tmp_path, *live)
        assert port_in_use(port)
        assert sweep("127.0.0.1", port, shm_dir=tmp_path) == []
        assert sorted(p.name for p in tmp_path.iterdir()) == live
    assert not port_in_use(port)
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    prefix = job_prefix("127.0.0.1", port)
    _segments(tmp_path, f"{prefix}2")
    assert sweep("127.0.0.1", port, shm_dir=tmp_path, created_since=since) == [f"{prefix}2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == live  # a dead run's leftovers from before this run


def test_a_rank_releases_its_own_segment_and_no_other(tmp_path: Path) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    prefix = job_prefix("127.0.0.1", 29500)
    _segments(tmp_path, f"{prefix}0", f"{prefix}1")
    assert release_own(1, env, shm_dir=tmp_path) is True
    assert [p.name for p in tmp_path.iterdir()] == [f"{prefix}0"]
    assert release_own(1, env, shm_dir=tmp_path) is False  # already gone: not an error
    assert release_own(0, {}, shm_dir=tmp_path) is False  # no rendezvous address: nothing to name
    assert [p.name for p in tmp_path.iterdir()] == [f"{prefix}0"]


@pytest.mark.slow
def test_a_two_rank_cpu_run_leaves_no_segment_in_dev_shm(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(str(tiny_model_dir), str(reverse_jsonl), str(tmp_path / "out"), training={"maxSteps": 2})
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(240) == 0, run.log()
    assert run.summary()["steps"] == 2
    left = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(job_prefix("127.0.0.1", run.port))]
    assert left == [], f"DeepSpeed shm segments left in {SHM_DIR}: {left}"


def _stopped_rank(run: Run) -> bool:
    return any(p.status() == psutil.STATUS_STOPPED for p in psutil.Process(run.proc.pid).children(recursive=True))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_run_failing_on_a_busy_port_leaves_the_live_runs_setup_alone(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    """Two local runs on one port: the second fails in its setup (EADDRINUSE); the first still finishes.

    The first run's rank 1 is stopped just before DeepSpeed's shm setup, so rank 0's segment
    exists and rank 1 has not mapped it yet: the window in which a foreign sweep stranded it.
    """
    port = free_port()
    manifest = job_manifest(str(tiny_model_dir), str(reverse_jsonl), str(tmp_path / "a"), training={"maxSteps": 2})
    live = launch(
        render_config(tmp_path / "config-a", manifest),
        tmp_path / "a",
        port=port,
        tag="live",
        env={"FTJOB_FAULT_STOP": "shm-setup:1", "FTJOB_SHM_SETUP_TIMEOUT_SECONDS": "300"},
    )
    segment = SHM_DIR / f"{job_prefix('127.0.0.1', port)}0"
    assert wait_for(lambda: segment.exists() and _stopped_rank(live), timeout=180), live.log()[-3000:]

    # One rank: it fails on the busy port (EADDRINUSE) and never talks to the live run's store.
    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        str(tmp_path / "b"),
        training={"maxSteps": 2},
        resources={"numNodes": 1, "gpusPerNode": 0},
    )
    other = launch(render_config(tmp_path / "config-b", manifest), tmp_path / "b", port=port, tag="other")
    assert other.wait(180) != 0, other.log()[-3000:]
    assert segment.exists(), "the failed run swept the live run's shared-memory segment"

    os.killpg(live.proc.pid, signal.SIGCONT)
    assert live.wait(240) == 0, live.log()[-3000:]
    assert live.summary()["steps"] == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_shm_setup_missing_a_peer_segment_fails_clearly_instead_of_hanging(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(str(tiny_model_dir), str(reverse_jsonl), str(tmp_path / "out"), training={"maxSteps": 2})
    run = launch(
        render_config(tmp_path / "config", manifest),
        tmp_path / "out",
        env={"FTJOB_FAULT_STOP": "shm-setup:1", "FTJOB_SHM_SETUP_TIMEOUT_SECONDS": "15"},
    )
    segment = SHM_DIR / f"{job_prefix('127.0.0.1', run.port)}0"
    assert wait_for(lambda: segment.exists() and _stopped_rank(run), timeout=180), run.log()[-3000:]
    segment.unlink()  # what a foreign sweep did: rank 1 now waits for a name that never comes
    os.killpg(run.proc.pid, signal.SIGCONT)
    assert run.wait(120) == 1, run.log()[-3000:]
    message = run.termination()
    assert message.startswith("TrainingError: DeepSpeed's shared-memory setup (shm_initialize) did not finish"), message
    # Rank 1 waits for the segment that is gone. Rank 0 waits for rank 1's, which appears only
    # after SIGCONT: on a loaded host its own 15 s can run out first. Either is a clear failure.
    assert re.search(r"within 15 s on rank [01]:", message), message
    assert f"master port {run.port}" in message
