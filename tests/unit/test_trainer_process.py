"""`ftjob train` and `ftjob run` reach the trainer as a process (`cli/trainer_process.py`), never by import.

Real processes throughout: tiny child programs for exit statuses and signals (a shell is the
oracle for what a status looks like), the real trainer for `ftjob train`'s exec and `ftjob run`'s
reported result (a completed job, so nothing trains), and an interpreter without the trainer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import psutil
import pytest

import finetune_operator
from finetune_operator.cli.trainer_process import TRAINER_MODULE, missing_trainer, run_process
from tests.support.training_runs import REPO, job_manifest, render_config, wait_for

pytestmark = pytest.mark.timeout(120)

FTJOB = [sys.executable, "-m", "finetune_operator.cli.main"]
SUMMARY = {"steps": 4, "tokens": 512, "finalLoss": 1.25, "adapterUri": "/out/adapter"}
REPORTED = {**SUMMARY, "samples": 0, "skippedRecords": 0}
"""SUMMARY as the trainer reports it (TrainingSummary's wire form, with its defaults)."""


def _shell_status(code: str) -> int:
    """What `sh` shows in `$?` for `python -c CODE`."""
    out = subprocess.run(
        ["sh", "-c", '"$0" -c "$1"; echo $?', sys.executable, code], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("import sys; sys.exit(0)", 0),
        ("import sys; sys.exit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143),
    ],
    ids=["exit-0", "exit-3", "killed", "terminated"],
)
def test_a_childs_exit_status_comes_back_as_a_shell_shows_it(code: str, status: int) -> None:
    assert run_process([sys.executable, "-c", code]) == _shell_status(code) == status


CHILD = """
import signal, sys, time
def stop(signum, frame):
    print(f"child: {signal.Signals(signum).name}, checkpoint saved", flush=True)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("child: ready", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_the_parent_reaches_the_child_whose_code_comes_back(signum: int) -> None:
    """A SIGTERM or SIGINT sent to the parent alone (not its group) is passed on: the child stops
    its own way (as a preempted trainer saves its step and exits 143) and its code is the parent's."""
    driver = textwrap.dedent(
        f"""
        import sys
        from finetune_operator.cli.trainer_process import run_process
        sys.exit(run_process([sys.executable, "-c", {CHILD!r}]))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "child: ready"  # the child's stdout is the parent's
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum
    assert f"child: {signal.Signals(signum).name}, checkpoint saved" in out


def _completed_job(tmp_path: Path) -> tuple[Path, Path]:
    """A rendered config and an output folder that already holds a completed run (nothing trains)."""
    manifest = job_manifest("builtin://tiny-llama", "builtin://reverse-words", "/out")
    config = render_config(tmp_path / "config", manifest)
    output = tmp_path / "out"
    output.mkdir()
    (output / "COMPLETED.json").write_text(json.dumps(SUMMARY))
    return config, output


def test_ftjob_train_becomes_the_trainer_and_its_signals_and_status_are_the_trainers(tmp_path: Path) -> None:
    """Same pid (in a pod the trainer stays the container's main process), the trainer's module
    running in it; a completed job idles until SIGTERM, then exits 0 with the summary on stdout."""
    config, output = _completed_job(tmp_path)
    env = {**os.environ, "FTJOB_OUTPUT_DIR": str(output), "FTJOB_TERMINATION_LOG": str(tmp_path / "termination")}
    proc = subprocess.Popen(
        [*FTJOB, "train", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    try:

        def idling() -> bool:
            return psutil.Process(proc.pid).cmdline()[1:3] == ["-m", TRAINER_MODULE]

        assert wait_for(idling, timeout=60), psutil.Process(proc.pid).cmdline()
        assert psutil.Process(proc.pid).children() == []  # no process in between
        assert proc.stdout is not None
        assert "job already completed" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == REPORTED
    assert json.loads((tmp_path / "termination").read_text()) == REPORTED


def test_ftjob_train_passes_the_trainers_failure_line_and_exit_code_through(tmp_path: Path) -> None:
    missing = tmp_path / "no-config"
    env = {**os.environ, "FTJOB_TERMINATION_LOG": str(tmp_path / "termination")}
    done = subprocess.run(
        [*FTJOB, "train", "--config", str(missing)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=90,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ConfigError: ") and str(missing) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "termination").read_text().strip() == done.stderr.strip()


def test_ftjob_run_reports_the_result_its_trainer_process_wrote(tmp_path: Path) -> None:
    """`ftjob run` on a job whose output holds a completed run: the trainer (a child process)
    finds it, and the summary it reports is the one `ftjob run` prints."""
    _, output = _completed_job(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(job_manifest("builtin://tiny-llama", "builtin://reverse-words", "/out")))
    done = subprocess.run(
        [*FTJOB, "run", str(job), "--output", str(output), "--no-progress"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == REPORTED
    assert "the output folder holds a completed run (COMPLETED.json); nothing to do" in done.stderr
    assert "train loss (last step) 1.2500" in done.stderr


def _python_without_the_trainer(folder: Path) -> Path:
    """An interpreter with this project's dependencies and the operator, and no trainer: a venv
    whose path names the test venv's site-packages (its editable finder, which maps the trainer,
    is a .pth file there and is not run) and the folder that holds finetune_operator."""
    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages")]
    operator_folder = Path(finetune_operator.__file__).resolve().parents[1]
    (Path(site) / "paths.pth").write_text("\n".join([*ours, str(operator_folder)]) + "\n")
    return python


def test_without_the_trainer_train_and_run_say_what_is_missing(tmp_path: Path) -> None:
    python = _python_without_the_trainer(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('finetune_trainer'), u.find_spec('pydantic'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.startswith("None ModuleSpec"), probe.stdout  # the operator's needs are there
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(job_manifest("builtin://tiny-llama", "builtin://reverse-words", "/out")))
    commands = {
        "train": ["train", "--config", str(tmp_path / "config")],
        "run": ["run", str(job), "--output", str(tmp_path / "out")],
    }
    for name, args in commands.items():
        done = subprocess.run(
            [python, "-m", "finetune_operator.cli.main", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert done.returncode == 1, (name, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ftjob {name}: the trainer cannot run here: {python} has no finetune_trainer. ")
        assert "pip install 'finetune-operator[trainer]'" in last


def test_the_missing_packages_are_named() -> None:
    assert missing_trainer("run", ("json", "os")) is None
    message = missing_trainer("run", ("json", "no_such_package_for_ftjob", "also_missing_for_ftjob"))
    assert message is not None and "has no no_such_package_for_ftjob, also_missing_for_ftjob." in message
