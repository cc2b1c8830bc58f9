"""The node launcher: DeepSpeed's launch contract (rank numbering and environment), and its watch
over real child processes (a failed rank stops the others; SIGTERM stops them all), with ranks
started as fresh interpreters (a GPU node) and forked from the launcher (a CPU node)."""

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

from finetune_trainer.pod.launch import world_info
from finetune_trainer.pod.node_launcher import (
    CPU_PRELOAD,
    PRELOAD_ENV,
    RUN_STATE_ENV,
    STOPPING_FILE,
    decode_world,
    exit_code,
    node_slots,
    preload_modules,
    rank_env,
    supervise,
)

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
    env = rank_env({"KEEP": "1", "RANK": "stale"}, slots, 1, 2, master_addr="127.0.0.2", master_port=29501, cpus=7)
    assert env == {
        "KEEP": "1",
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
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


@pytest.mark.parametrize(
    ("base", "cpus", "threads"),
    [
        ({}, 128, ("16", "16")),  # a GPU pod without resources.cpu: the node's CPUs shared by 8 ranks
        ({}, 4, ("1", "1")),  # never 0
        ({"OMP_NUM_THREADS": "3"}, 128, ("3", "3")),  # rendered from resources.cpu, or the user's
        ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "5"}, 128, ("3", "5")),
    ],
    ids=["share", "at-least-one", "omp-given", "both-given"],
)
def test_each_rank_gets_its_share_of_the_cpus(base: dict[str, str], cpus: int, threads: tuple[str, str]) -> None:
    """Without OMP_NUM_THREADS torch and MKL start one thread per host core in every rank."""
    slots = node_slots({"pod-0": list(range(8))}, 0)
    env = rank_env(base, slots, 0, 5, master_addr="a", master_port=1, cpus=cpus)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == threads


def test_a_rank_started_by_the_launcher_runs_its_share_of_threads(tmp_path: Path) -> None:
    """The real launcher, without OMP_NUM_THREADS in its environment, gives each rank its share of
    the CPUs it may use (two ranks here)."""
    report = tmp_path / "threads"
    script = tmp_path / "report_threads.py"
    script.write_text(
        "import os, sys\n"
        "with open(sys.argv[1] + os.environ['LOCAL_RANK'], 'w') as fh:\n"
        "    fh.write(os.environ['OMP_NUM_THREADS'] + ' ' + os.environ['MKL_NUM_THREADS'])\n"
    )
    world = world_info((("localhost", 2),))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update({"PYTHONPATH": f"{tmp_path}:{env.get('PYTHONPATH', '')}", PRELOAD_ENV: "none"})
    args = [f"--world_info={world}", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=1"]
    done = subprocess.run(
        [sys.executable, "-m", "finetune_trainer.pod.node_launcher", *args, "report_threads", str(report)],
        env=env,
        timeout=50,
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert [(tmp_path / f"threads{r}").read_text() for r in (0, 1)] == [f"{share} {share}"] * 2


def test_a_bad_world_or_node_rank_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--node_rank=2, but the world has 2 nodes"):
        node_slots(WORLD, 2)
    with pytest.raises(ValueError, match="not a non-empty"):
        decode_world(world_info(()))


def test_a_signal_becomes_128_plus_its_number() -> None:
    assert (exit_code(0), exit_code(3), exit_code(-9), exit_code(-15)) == (0, 3, 137, 143)


@pytest.mark.parametrize(
    ("environ", "modules"),
    [
        ({"DS_ACCELERATOR": "cpu"}, list(CPU_PRELOAD)),
        ({"DS_ACCELERATOR": "cpu", PRELOAD_ENV: "none"}, []),
        ({"DS_ACCELERATOR": "cpu", PRELOAD_ENV: " json, csv ,"}, ["json", "csv"]),
        ({}, []),
        ({"DS_ACCELERATOR": "cuda", PRELOAD_ENV: "json"}, []),
    ],
    ids=["cpu-default", "cpu-none", "cpu-listed", "gpu", "gpu-listed-is-ignored"],
)
def test_only_a_cpu_node_forks_its_ranks_from_preloaded_modules(environ: dict[str, str], modules: list[str]) -> None:
    assert preload_modules(environ) == modules


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_failed_rank_stops_the_others_and_is_the_result() -> None:
    sleepers = [_python("import time; time.sleep(60)") for _ in range(2)]
    failing = _python("import time; time.sleep(0.3); raise SystemExit(3)")
    started = time.monotonic()
    assert supervise([*sleepers, failing], grace=5) == 3
    assert time.monotonic() - started < 20
    assert all(p.returncode is not None for p in sleepers)


def test_a_rank_the_launcher_sigkills_while_stopping_is_not_taken_for_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 fails with a written error; rank 1 ignores SIGTERM and is SIGKILLed at the end of
    its grace. The failure is rank 0's (a stop-38-era CI run reported rank 1's SIGKILL instead)."""
    from finetune_trainer import outcome

    monkeypatch.setenv(RUN_STATE_ENV, str(tmp_path))
    state = repr(str(tmp_path))
    failing = _python(
        "import time; from pathlib import Path; from finetune_trainer import outcome as o; "
        f"o.mark_rank(Path({state}), 0, 'started'); time.sleep(0.5); "
        f"o.write_rank_failure(Path({state}), 0, 'OutputFull: no space left (rank 0)'); raise SystemExit(1)"
    )
    stubborn = _python(
        "import signal, time; from pathlib import Path; from finetune_trainer import outcome as o; "
        f"signal.signal(signal.SIGTERM, signal.SIG_IGN); o.mark_rank(Path({state}), 1, 'started'); time.sleep(60)"
    )
    assert supervise([failing, stubborn], grace=1) == 1
    assert stubborn.returncode in (-signal.SIGKILL, 137)
    assert (tmp_path / outcome.STOPPING_FILE).exists() and STOPPING_FILE == outcome.STOPPING_FILE
    assert outcome.root_cause(tmp_path, 0) == ("OutputFull: no space left (rank 0)", 1)


def test_a_rank_killed_by_sigkill_is_reported_as_137() -> None:
    victim = _python("import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    other = _python("import time; time.sleep(60)")
    assert supervise([victim, other], grace=5) == 137
    assert other.returncode is not None


def test_ranks_that_all_succeed_give_0() -> None:
    assert supervise([_python("pass"), _python("import time; time.sleep(0.2)")]) == 0


LAUNCH_MODES = {"fresh": {PRELOAD_ENV: "none"}, "forked": {PRELOAD_ENV: "json", "DS_ACCELERATOR": "cpu"}}
"""Ranks as fresh interpreters, and forked from a launcher that imported `json` (a light stand-in)."""


def _launcher(tmp_path: Path, mode: str, node_rank: int, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    """The node launcher on a 3-rank world of two nodes, as the entrypoint starts it, running rank_probe."""
    env = {**os.environ, **LAUNCH_MODES[mode], **extra}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    cmd = [
        sys.executable, "-m", "finetune_trainer.pod.node_launcher", f"--world_info={world_info((('a', 1), ('b', 2)))}",
        f"--node_rank={node_rank}", "--master_addr=127.0.0.1", "--master_port=29999", "rank_probe", *args,
    ]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)


@pytest.mark.parametrize("mode", list(LAUNCH_MODES))
def test_a_ranks_exit_status_is_the_launchers(tmp_path: Path, mode: str) -> None:
    """`python -m` semantics in both modes: exit codes, sys.exit("message"), an exception, a clean end."""
    (tmp_path / "rank_probe.py").write_text(
        "import os, sys\n"
        "how = sys.argv[1]\n"
        "if how == 'code': sys.exit(3)\n"
        "if how == 'message': sys.exit('the dataset is gone')\n"
        "if how == 'raise': raise RuntimeError('rank ' + os.environ['RANK'] + ' broke')\n"
    )
    results = {}
    for how in ("code", "message", "raise", "fine"):
        launcher = _launcher(tmp_path, mode, 1, how)
        _, err = launcher.communicate(timeout=30)
        results[how] = (launcher.returncode, err.decode())
    assert {how: code for how, (code, _) in results.items()} == {"code": 3, "message": 1, "raise": 1, "fine": 0}
    assert "the dataset is gone" in results["message"][1]
    assert "RuntimeError: rank 1 broke" in results["raise"][1] or "RuntimeError: rank 2 broke" in results["raise"][1]


@pytest.mark.parametrize("mode", list(LAUNCH_MODES))
def test_sigterm_stops_the_launcher_and_every_rank(tmp_path: Path, mode: str) -> None:
    """Each rank records its environment, then sleeps; SIGTERM to the launcher stops them all."""
    (tmp_path / "rank_probe.py").write_text(
        "import json, os, sys, time\n"
        "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_PORT', 'CUDA_VISIBLE_DEVICES')\n"
        "out = os.path.join(sys.argv[1], 'rank-' + os.environ['RANK'] + '.json')\n"
        "with open(out + '.tmp', 'w') as f:\n"
        "    json.dump({k: os.environ[k] for k in keys} | {'argv': sys.argv[1:]}, f)\n"
        "os.replace(out + '.tmp', out)  # the test polls for the file: it must never see it half written\n"
        "time.sleep(60)\n"
    )
    launcher = _launcher(tmp_path, mode, 1, str(tmp_path), RANK="stale")
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


def test_every_name_a_rank_gets_is_one_of_the_pod_contracts_launcher_names() -> None:
    from finetune_operator.api.pod_env import LAUNCHER_SET, PodEnv

    env = rank_env({}, node_slots(WORLD, 1), 1, 0, master_addr="127.0.0.1", master_port=29500)
    threads = {PodEnv.OMP_NUM_THREADS, PodEnv.MKL_NUM_THREADS}  # the operator's defaults, filled in where unset
    assert set(env) <= {str(name) for name in LAUNCHER_SET | {PodEnv.MASTER_ADDR, PodEnv.MASTER_PORT} | threads}


def test_a_rank_that_aborts_is_reported_as_an_abort_not_the_memory_killer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL's watchdog ends a rank stuck in a timed-out collective with SIGABRT and no Python
    error: the real launcher's report of it, through the entrypoint's conclusion, once read
    "SIGKILL, exit 137: the kernel's memory killer". Rank 1 aborts; rank 0 is stopped by the
    launcher (and says so, as a worker does)."""
    from finetune_operator.reconcile import termination
    from finetune_operator.reconcile.observed import Termination
    from finetune_trainer.pod import launch

    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "aborting_rank.py").write_text(
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "from finetune_trainer import outcome\n"
        "rank, state = int(os.environ['RANK']), Path(os.environ['FTJOB_RUN_STATE_DIR'])\n"
        "def stopped(signum, frame):\n"
        "    outcome.write_rank_failure(state, rank, f'Terminated: stopped by SIGTERM (rank {rank})')\n"
        "    sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, stopped)\n"
        "outcome.mark_rank(state, rank, 'started')\n"
        "if rank == 1:\n"
        "    time.sleep(0.5)\n"
        "    os.abort()\n"
        "time.sleep(50)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}", PRELOAD_ENV: "none"}
    env[RUN_STATE_ENV] = str(state)
    args = [f"--world_info={world_info((('localhost', 2),))}", "--node_rank=0", "--master_addr=a", "--master_port=1"]
    launcher = subprocess.run(
        [sys.executable, "-m", "finetune_trainer.pod.node_launcher", *args, "aborting_rank"],
        env=env,
        timeout=50,
        check=False,
        capture_output=True,
    )
    assert launcher.returncode == 128 + signal.SIGABRT, launcher.stderr
    monkeypatch.setenv("FTJOB_TERMINATION_LOG", str(tmp_path / "termination-log"))
    result = launch._conclude(state, launcher.returncode, 0, 0, [])
    assert result.exit_code == 134, result.message
    assert result.message.startswith("RankAborted: rank 1 on node 0 aborted without an error message (SIGABRT")
    assert "collective" in result.message and "memory" not in result.message
    kubelet = Termination(exit_code=134, reason="Error", message=result.message, finished_at="2026-12-05T00:00:00Z")
    assert not termination.is_out_of_memory(kubelet)  # a collective timeout is never re-planned
    assert (tmp_path / "termination-log").read_text() == result.message + "\n"
