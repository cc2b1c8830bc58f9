"""Running a benchmark script the way a user runs it (the bench tier's smoke runs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.factories import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"


def run_script(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/<argv>` from the repository root; on a timeout its whole process tree goes."""
    paths = [REPO_ROOT, REPO_ROOT / "operator", REPO_ROOT / "trainer_image", REPO_ROOT / "tools" / "localcluster"]
    python_path = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])  # this checkout's code
    env = {**os.environ, "PYTHONPATH": python_path, "DS_ACCELERATOR": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / argv[0]), *argv[1:]],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = psutil.Process(proc.pid).children(recursive=True)  # ranks may sit in sessions of their own
        os.killpg(proc.pid, signal.SIGKILL)
        for child in tree:
            with contextlib.suppress(psutil.Error):
                child.kill()
        out, err = proc.communicate()
        pytest.fail(f"{argv[0]} still running after {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
