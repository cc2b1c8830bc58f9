"""The node launcher: DeepSpeed's launch contract (rank numbering and environment), and its watch
over real child processes (a failed rank stops the others; SIGTERM stops them all)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from finetune_trainer.launch import world_info
from finetune_trainer.node_launcher import decode_world, exit_code, node_slots, rank_env, supervise

pytestmark = pytest.mark.timeout(60)

WORLD = {"pod-0": [0, 1], "pod-1": [0, 1, 2]}
"""Two nodes of unequal size: global ranks are numbered host by host."""


def test_the_world_round_trips_through_the_entrypoints_encoding() -> None:
    assert decode_world(world_info((("pod-0", 2), ("pod-1", 3)))) == WORLD


@pytest.mark.parametrize(
    ("node_rank", "ranks", "devices"), [(0, (0, 1), (0, 1)), (1, (2, 3, 4), (0, 1, 2))], ids=["node0", "node1"]
)
def test_ranks_are_numbered_host_by_host(node_rank: int, ranks: tuple[int, ...], devices: tuple[int, ...]) -> None:
    slots = node_slots(WORLD, node_rank)
    assert (slots.nodes, slots.world_size, slots.global_ranks, slots.device_ids) == (2, 5, ranks, devices)


def test_each_rank_gets_deepspeeds_environment() -> None:
    slots = node_slots(WORLD, 1)
    env = rank_env({"KEEP": "1", "RANK": "stale"}, slots, 1, 2, master_addr="127.0.0.2", master_port=29501)
    assert env == {
        "KEEP": "1",
        "MASTER_ADDR": "127.0.0.2",
        "MASTER_PORT": "29501",
        "WORLD_SIZE": "5",
        "CROSS_RANK": "1",
        "CROSS_SIZE": "2",
        "LOCAL_SIZE": "3",
        "RANK": "4",
        "LOCAL_RANK": "2",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
    }


def test_a_bad_world_or_node_rank_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--node_rank=2, but the world has 2 nodes"):
        node_slots(WORLD, 2)
    with pytest.raises(ValueError, match="not a non-empty"):
        decode_world(world_info(()))


def test_a_signal_becomes_128_plus_its_number() -> None:
    assert (exit_code(0), exit_code(3), exit_code(-9), exit_code(-15)) == (0, 3, 137, 143)


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_failed_rank_stops_the_others_and_is_the_result() -> None:
    sleepers = [_python("import time; time.sleep(60)") for _ in range(2)]
    failing = _python("import time; time.sleep(0.3); raise SystemExit(3)")
    started = time.monotonic()
    assert supervise([*sleepers, failing], grace=5) == 3
    assert time.monotonic() - started < 20
    assert all(p.returncode is not None for p in sleepers)


def test_a_rank_killed_by_sigkill_is_reported_as_137() -> None:
    victim = _python("import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    other = _python("import time; time.sleep(60)")
    assert supervise([victim, other], grace=5) == 137
    assert other.returncode is not None


def test_ranks_that_all_succeed_give_0() -> None:
    assert supervise([_python("pass"), _python("import time; time.sleep(0.2)")]) == 0


def test_sigterm_stops_the_launcher_and_every_rank(tmp_path: Path) -> None:
    """Started as the entrypoint starts it: each rank records its environment, then sleeps."""
    (tmp_path / "rank_probe.py").write_text(
        "import json, os, sys, time\n"
        "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_PORT', 'CUDA_VISIBLE_DEVICES')\n"
        "out = os.path.join(sys.argv[1], 'rank-' + os.environ['RANK'] + '.json')\n"
        "json.dump({k: os.environ[k] for k in keys} | {'argv': sys.argv[1:]}, open(out, 'w'))\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable, "-m", "finetune_trainer.node_launcher", f"--world_info={world_info((('a', 1), ('b', 2)))}",
        "--node_rank=1", "--master_addr=127.0.0.1", "--master_port=29999", "rank_probe", str(tmp_path),
    ]  # fmt: skip
    launcher = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("rank-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        reports = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
        assert reports == {
            f"rank-{r}.json": {"RANK": str(r), "LOCAL_RANK": str(r - 1), "WORLD_SIZE": "3", "MASTER_PORT": "29999",
                               "CUDA_VISIBLE_DEVICES": "0,1", "argv": [str(tmp_path)]}
            for r in (1, 2)
        }  # fmt: skip
        ranks = psutil.Process(launcher.pid).children()
        assert len(ranks) == 2
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(20) == 1
        assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if launcher.poll() is None:
            launcher.kill()
