"""The Python client and the day-two verbs (`ftjob submit/logs/wait/describe`) against the real
apiserver, the real operator and real ranks on the process node.

One tiny job runs end to end (module-scoped, as the other end-to-end tests run theirs): it is
submitted with `ftjob submit --wait`, both its ranks are SIGKILLed at step 6 (a gang restart),
and while it runs the client follows rank 0's log and `ftjob logs -f --rank 1` follows rank 1's,
across the restart; `wait` with a short timeout and `describe` are asked on the way. A job
created suspended (it never takes a pod) serves the cheap calls: suspend, resume, list, delete.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube, LocalCluster, wait_for
from finetune_localcluster.devtools import OperatorProcess, bind_claim
from finetune_operator.api import FineTuneJob, FineTuneJobSpec
from finetune_operator.client import FineTuneClient, JobNotFound, JobRejected, WaitTimeout
from tests.cluster.operator_harness import namespaces
from tests.cluster.process_jobs import CLAIM, tiny_job
from tests.factories import job_document

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

MAX_STEPS, CHECKPOINT_EVERY, SLOW_AT, KILL_AT = 12, 4, 3, 6
JOB = "tiny-cpu"


def ftjob(kubeconfig: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli.main", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@dataclass
class Run:
    client: FineTuneClient
    ns: str
    final: FineTuneJob
    submit: subprocess.CompletedProcess[str]
    rank0_lines: list[str]
    rank1_out: str
    rank1_code: int
    timeout_error: WaitTimeout
    timeout_cli: subprocess.CompletedProcess[str]
    describe_running: str
    progress_seen: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
def run(
    kube: Kube, kubeconfig: Path, local_cluster: LocalCluster, operator: OperatorProcess, tmp_path_factory: Any
) -> Iterator[Run]:
    with namespaces(kube, "t-client") as make, FineTuneClient(make(restricted=True), kubeconfig=kubeconfig) as client:
        ns = client.namespace
        bind_claim(kube, ns, CLAIM)
        doc = tiny_job(ns, max_steps=MAX_STEPS, checkpoint_every=CHECKPOINT_EVERY)
        doc["spec"]["env"] = [
            {"name": "FTJOB_FAULT_KILL", "value": f"step:{KILL_AT}"},
            # the first gang rests at step 3, so `describe` finds rank 0 alive (status lags the ranks)
            {"name": "FTJOB_FAULT_SLOW", "value": f"step:{SLOW_AT}"},
            {"name": "FTJOB_FAULT_SLOW_SECONDS", "value": "30"},
        ]
        doc["spec"]["failurePolicy"] = {"backoffLimit": 2}
        path = tmp_path_factory.mktemp("client") / "job.yaml"
        path.write_text(yaml.safe_dump(doc))
        submit = subprocess.Popen(
            [sys.executable, "-m", "finetune_operator.cli.main", "submit", "-f", str(path), "--wait",
             "--timeout", "20m", "--kubeconfig", str(kubeconfig)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: _exists(client), 60, "the submitted job")
            rank0: list[str] = []
            follower = threading.Thread(target=lambda: rank0.extend(client.logs(JOB, rank=0, follow=True)))
            follower.start()
            rank1 = subprocess.Popen(
                [sys.executable, "-m", "finetune_operator.cli.main", "logs", JOB, "-f", "--rank", "1",
                 "-n", ns, "--kubeconfig", str(kubeconfig)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                seen: list[int] = []

                def stepped(job: FineTuneJob) -> None:
                    if job.status and job.status.progress:
                        seen.append(job.status.progress.step)

                client.wait(JOB, "Running", timeout=600)
                with pytest.raises(WaitTimeout) as timed_out:
                    client.wait(JOB, "Succeeded", timeout=2)
                timeout_cli = ftjob(kubeconfig, "wait", JOB, "--for", "Succeeded", "--timeout", "2s", "-n", ns)
                wait_for(lambda: _step(client) >= SLOW_AT - 1, 600, "rank 0's progress in status")
                describe_running = ftjob(kubeconfig, "describe", JOB, "-n", ns).stdout
                final = client.wait(JOB, "Succeeded", timeout=900, on_progress=stepped)
                out, err = submit.communicate(timeout=120)
                follower.join(timeout=120)
                rank1_out, rank1_err = rank1.communicate(timeout=120)
            finally:
                for process in (rank1, submit):
                    if process.poll() is None:
                        process.kill()
                        process.wait()
            assert not follower.is_alive(), "client.logs(follow=True) did not end when the job did"
            yield Run(
                client, ns, final, subprocess.CompletedProcess(submit.args, submit.returncode, out, err), rank0,
                rank1_out + rank1_err, rank1.returncode, timed_out.value, timeout_cli, describe_running, seen,
            )  # fmt: skip
        finally:
            if submit.poll() is None:
                submit.kill()
                submit.wait()


def _exists(client: FineTuneClient) -> bool:
    try:
        client.get(JOB)
    except JobNotFound:
        return False
    return True


def _step(client: FineTuneClient) -> int:
    job = client.get(JOB)
    return job.status.progress.step if job.status and job.status.progress else 0


def test_submit_wait_succeeds_with_progress_lines(run: Run) -> None:
    assert run.submit.returncode == 0, (run.submit.stdout, run.submit.stderr)
    assert f"finetunejob.finetune.dev/{JOB} created in {run.ns}" in run.submit.stdout
    assert f"{JOB} is Succeeded" in run.submit.stdout
    # not a terminal: plain progress lines, one per change, the last at the total
    assert f"{JOB} Running step " in run.submit.stderr, run.submit.stderr
    assert f"{JOB} Succeeded step {MAX_STEPS}/{MAX_STEPS} (100%)" in run.submit.stderr, run.submit.stderr
    result = run.final.status.result if run.final.status else None
    assert result is not None and result.steps == MAX_STEPS
    assert run.final.status is not None and run.final.status.restarts == 1
    assert run.progress_seen and max(run.progress_seen) == MAX_STEPS


def test_logs_follow_crosses_the_gang_restart(run: Run) -> None:
    text = "\n".join(run.rank0_lines)
    # rank 0 logs its setup once per gang: both gangs' pods were followed, the second from its start
    setups = [i for i, line in enumerate(run.rank0_lines) if "trainable parameters" in line]
    assert len(setups) == 2, text[-4000:]
    resumed = [i for i, line in enumerate(run.rank0_lines) if "resumed from" in line]
    assert resumed and setups[0] < resumed[0], text[-4000:]  # only the second gang resumes
    assert run.rank1_code == 0 and run.rank1_out.strip(), run.rank1_out[-3000:]


def test_wait_times_out_with_a_clear_message(run: Run) -> None:
    assert str(run.timeout_error).startswith(f"timed out after 2s waiting for {JOB} to be Succeeded: it is ")
    assert run.timeout_error.job is not None and run.timeout_error.job.name == JOB
    assert run.timeout_cli.returncode == 124, (run.timeout_cli.stdout, run.timeout_cli.stderr)
    assert f"error: timed out after 2s waiting for {JOB} to be Succeeded: it is " in run.timeout_cli.stderr


def test_describe_shows_progress_plan_and_measured_memory(run: Run, kubeconfig: Path) -> None:
    text = run.describe_running
    assert f"Name:        {JOB}" in text and "Progress:    step " in text, text
    assert "Memory per rank (plan vs measured on rank 0):" in text, text
    weights = next(line for line in text.splitlines() if line.strip().startswith("weights"))
    planned, measured = weights.split()[1], weights.split()[3]
    assert planned != "-" and measured != "-", text  # rank 0's /metrics answered
    done = ftjob(kubeconfig, "describe", JOB, "-n", run.ns)
    assert done.returncode == 0, done.stderr
    assert "State:       Succeeded" in done.stdout and "Result:" in done.stdout, done.stdout
    assert f"  steps       {MAX_STEPS}," in done.stdout and "final loss" in done.stdout, done.stdout
    assert "Completed" in done.stdout.split("Events (last")[1], done.stdout  # the last events include the end


def test_suspend_resume_list_delete(kube: Kube, kubeconfig: Path, operator: OperatorProcess) -> None:
    with namespaces(kube, "t-client-calls") as make, FineTuneClient(make(), kubeconfig=kubeconfig) as client:
        spec = FineTuneJobSpec.from_wire({**job_document()["spec"], "suspend": True})
        created = client.submit(spec, name="idle")
        assert created.metadata.uid and created.namespace == client.namespace
        assert client.wait("idle", "Suspended", timeout=60).spec.suspend
        assert [j.name for j in client.list()] == ["idle"] and client.list("team=none") == []
        resumed = client.resume("idle")
        assert not resumed.spec.suspend
        assert client.suspend("idle").spec.suspend
        with pytest.raises(WaitTimeout, match="timed out after 1s waiting for idle to be Failed: it is "):
            client.wait("idle", "Failed", timeout=1)
        client.delete("idle", wait=True, timeout=60)
        with pytest.raises(JobNotFound):
            client.get("idle")
        with pytest.raises(JobNotFound):
            client.wait("idle", timeout=5)


def test_a_refused_spec_carries_the_apiservers_field_messages(
    kube: Kube, kubeconfig: Path, local_cluster: LocalCluster, crd: dict[str, Any], tmp_path: Path
) -> None:
    with namespaces(kube, "t-client-refused") as make, FineTuneClient(make(), kubeconfig=kubeconfig) as client:
        doc = job_document()
        doc["metadata"] = {"name": "labelled", "labels": {"team": "not a label value!"}}
        # The models do not judge labels; the apiserver does, and its causes come back one per field.
        with pytest.raises(JobRejected) as refused:
            client.submit(doc)
        assert refused.value.problems and refused.value.problems[0].startswith("metadata.labels: Invalid value: "), (
            refused.value.problems
        )
        assert str(refused.value).startswith("labelled: metadata.labels: Invalid value: ")
        # A file goes through the same reading as `ftjob validate`: the same lines, and exit 2 from submit.
        bad = job_document(training={"maxSteps": -1})
        bad["metadata"] = {"name": "negative"}
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(JobRejected) as local:
            client.submit(path)
        validate = ftjob_plain("validate", str(path))
        assert validate.returncode == 1 and local.value.problems == validate.stderr.splitlines(), (
            local.value.problems, validate.stderr,
        )  # fmt: skip
        submitted = ftjob(kubeconfig, "submit", "-f", str(path), "-n", client.namespace)
        assert submitted.returncode == 2 and submitted.stderr.splitlines() == local.value.problems, submitted.stderr
        assert client.list() == []
        # `kubectl ftjob` is the same program (kubectl finds kubectl-ftjob beside this Python)
        env = {**os.environ, **local_cluster.env()}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        plugin = subprocess.run(
            ["kubectl", "ftjob", "wait", "nothing", "--timeout", "2s", "-n", client.namespace],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert plugin.returncode == 3, (plugin.stdout, plugin.stderr)
        assert plugin.stderr == f"error: finetunejob {client.namespace}/nothing not found\n"


def ftjob_plain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
