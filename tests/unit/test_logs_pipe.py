"""`ftjob logs JOB | head`: the reader closing the pipe ends the command quietly, exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import argparse
    from finetune_operator.cli import logs_cmd

    class Client:  # stands in for the cluster: a long log
        def logs(self, job, rank, follow, tail_lines):
            for i in range(200_000):
                yield f"line {i} of {job}"

    logs_cmd.run_with_client = lambda args, body: body(Client())
    raise SystemExit(logs_cmd.run(argparse.Namespace(job="demo", rank=0, follow=False, tail=None)))
    """
)


def test_a_closed_pipe_ends_the_log_quietly() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("operator", "trainer_image", "."))}
    writer = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert writer.stdout is not None and writer.stderr is not None
    first = writer.stdout.readline()
    writer.stdout.close()  # what `head -1` does after its line
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=60) == 0, err
    assert first == b"line 0 of demo\n"
    assert "Traceback" not in err and "BrokenPipe" not in err, err
