"""`--cpu-durations` (tests/support/cpu_report.py) counts a test's child processes and ranks by CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import REPO_ROOT

BURN = """
import subprocess, sys

CHILD = "import time\\nwhile time.process_time() < {seconds}: pass"

def test_idle():
    pass

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", CHILD], check=True)
"""

SERVER = """
import os, subprocess, sys, time
from pathlib import Path

import pytest

BUSY = "import time\\nwhile time.process_time() < {seconds}: pass\\ntime.sleep(300)"

@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    yield proc
    proc.kill()
    proc.wait()  # its CPU moves to RUSAGE_CHILDREN here, in the last test's teardown

def test_server_burns(server):
    def cpu():
        fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    while cpu() < {seconds} - 0.02:
        time.sleep(0.05)

def test_zz_idle_last():
    pass
"""


def _pytest(tmp_path: Path, burn_seconds: float, *args: str, tests: str = BURN) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin on a file of tests, in `tmp_path` (outside this repo's settings)."""
    (tmp_path / "test_burn.py").write_text(tests.replace("{seconds}", str(burn_seconds)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.cpu_report", *args, "test_burn.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_childs_cpu_is_counted_and_the_busiest_test_comes_first(tmp_path: Path, workers: list[str]) -> None:
    done = _pytest(tmp_path, 0.6, "--cpu-durations=5", *workers)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\s*([\d.]+) CPU-s  (\S+)$", done.stdout, re.M)
    assert [name for _, name in rows] == ["test_burn.py::test_burns_in_a_child", "test_burn.py::test_idle"], done.stdout
    assert float(rows[0][0]) >= 0.6 > float(rows[1][0]), done.stdout
    assert "most CPU 5 (of " in done.stdout and " in 2 tests)" in done.stdout


def test_nothing_is_listed_without_the_option(tmp_path: Path) -> None:
    done = _pytest(tmp_path, 0.01)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
    assert "most CPU" not in done.stdout


def test_a_running_servers_cpu_goes_to_the_test_that_ran_meanwhile_not_the_last_one(tmp_path: Path) -> None:
    """A session fixture's server, still running, is counted while it works (the cluster tier's case)."""
    done = _pytest(tmp_path, 0.6, "--cpu-durations=5", tests=SERVER)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = dict((name, float(cpu)) for cpu, name in re.findall(r"^\s*([\d.]+) CPU-s  (\S+)$", done.stdout, re.M))
    assert rows["test_burn.py::test_server_burns"] >= 0.55, done.stdout
    assert rows["test_burn.py::test_zz_idle_last"] < 0.3, done.stdout
