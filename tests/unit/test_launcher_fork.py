"""Forking the node launcher from a process that already holds its preload (what the tests' fork
server does): when it is allowed, and that the forked child behaves like `python -u -m MODULE`
(its parent's temporary folders are not removed when it exits; its output is unbuffered).

Each case runs in a fresh interpreter: a pytest worker has threads of its own, and
`holds_preload` refuses a process with more than one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.fork_server import differs

pytestmark = pytest.mark.timeout(60)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )


def _python(code: str, tmp_path: Path) -> str:
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("environ", "imports", "thread", "holds"),
    [
        ({"DS_ACCELERATOR": "cpu", "FTJOB_LAUNCHER_PRELOAD": "json,wave"}, "json, wave", False, True),
        ({"DS_ACCELERATOR": "cpu", "FTJOB_LAUNCHER_PRELOAD": "json,wave"}, "json", False, False),
        ({"DS_ACCELERATOR": "cpu", "FTJOB_LAUNCHER_PRELOAD": "json,wave"}, "json, wave", True, False),
        ({"FTJOB_LAUNCHER_PRELOAD": "json,wave"}, "json, wave", False, False),
        ({"DS_ACCELERATOR": "cpu", "FTJOB_LAUNCHER_PRELOAD": "none"}, "json, wave", False, False),
    ],
    ids=["all imported", "one missing", "a second thread", "a GPU node", "preload switched off"],
)
def test_only_a_single_threaded_process_holding_the_whole_preload_forks_the_launcher(
    tmp_path: Path, environ: dict[str, str], imports: str, thread: bool, holds: bool
) -> None:
    code = f"""
        import threading, time
        import {imports}
        from finetune_trainer.pod.node_launcher import holds_preload
        if {thread}:
            threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        print(holds_preload({environ!r}))
    """
    assert _python(code, tmp_path) == str(holds)


def test_a_thread_that_was_joined_but_is_still_exiting_is_waited_for(tmp_path: Path) -> None:
    code = """
        import os, threading
        import json, wave
        from finetune_trainer.pod import node_launcher
        worker = threading.Thread(target=lambda: None)
        worker.start()
        worker.join()
        listed = iter([2, 2, 1])  # the kernel still lists the exiting thread twice
        real = os.listdir
        os.listdir = lambda path: ["t"] * next(listed) if path == "/proc/self/task" else real(path)
        print(node_launcher.holds_preload({"DS_ACCELERATOR": "cpu", "FTJOB_LAUNCHER_PRELOAD": "json,wave"}))
    """
    assert _python(code, tmp_path) == "True"


def test_a_forked_child_leaves_its_parents_temporary_folder_alone(tmp_path: Path) -> None:
    (tmp_path / "child_mod.py").write_text("print('child ran')\n")
    code = """
        import os, sys, tempfile
        from finetune_trainer.pod.node_launcher import fork_rank
        held = tempfile.TemporaryDirectory(dir='.')
        child = fork_rank('child_mod', [], dict(os.environ))
        code = child.wait()
        print(code, os.path.isdir(held.name))
    """
    assert _python(code, tmp_path) == "child ran\n0 True"


@pytest.mark.parametrize(("unbuffered", "kept"), [(True, True), (False, False)], ids=["-u", "buffered"])
def test_an_unbuffered_child_has_written_what_it_printed_when_it_is_killed(
    tmp_path: Path, unbuffered: bool, kept: bool
) -> None:
    (tmp_path / "dies.py").write_text("import os, signal\nprint('before')\nos.kill(os.getpid(), signal.SIGKILL)\n")
    code = f"""
        import os, sys
        from finetune_trainer.pod.node_launcher import fork_rank
        out = os.open('out.txt', os.O_WRONLY | os.O_CREAT)
        os.dup2(out, 1)
        sys.stdout = open(1, 'w', closefd=False)  # block-buffered, as a pod's log file
        child = fork_rank('dies', [], dict(os.environ), unbuffered={unbuffered})
        print(child.wait(), file=sys.stderr)
    """
    done = _run(code, tmp_path)
    assert done.stderr.strip() == "-9", done.stderr
    assert ("before" in (tmp_path / "out.txt").read_text()) is kept


def test_a_run_may_differ_from_the_fork_server_only_in_its_per_run_variables() -> None:
    server = {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "FTJOB_METRICS_PORT": "off"}
    per_run = {**server, "FTJOB_OUTPUT_DIR": "/o", "MASTER_PORT": "29501", "AWS_ACCESS_KEY_ID": "k", "MLFLOW_X": "1"}
    per_run["PYTEST_CURRENT_TEST"] = "tests/trainer/test_x.py::test_y (call)"
    assert differs(server, per_run) == []
    assert differs(server, {**per_run, "HF_HUB_OFFLINE": "0", "HF_HOME": "/h"}) == ["HF_HOME", "HF_HUB_OFFLINE"]
    assert differs(server, {k: v for k, v in per_run.items() if k != "PATH"}) == ["PATH"]
