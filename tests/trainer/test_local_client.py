"""`LocalClient`: the client's calls on this machine, through real `ftjob run` processes.

One job of two CPU ranks: submitted, suspended once it has trained a few steps (SIGTERM: the
ranks save a checkpoint, as a preempted pod's do), a wait that times out while it is suspended,
resumed (it continues from that checkpoint), waited for to the end, its log read, deleted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from finetune_operator.api import FineTuneJob
from finetune_operator.client import JobExists, JobNotFound, LocalClient, WaitTimeout
from finetune_operator.client.views import state_of
from tests.support.training_runs import job_manifest

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 12


def test_local_client_submits_suspends_resumes_and_finishes(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path
) -> None:
    out = tmp_path / "out"
    manifest = job_manifest(
        str(tiny_model_dir), str(reverse_jsonl), str(out), training={"maxSteps": STEPS, "checkpointEverySteps": 100}
    )
    manifest["metadata"]["name"] = "local-try"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    with LocalClient(tmp_path / "runs", poll_seconds=0.2) as client:
        job = client.submit(tmp_path / "job.yaml")
        assert job.status is not None and job.status.state == "Running"
        with pytest.raises(JobExists):
            client.submit(tmp_path / "job.yaml")
        deadline = time.monotonic() + 300
        while _step(client.get("local-try")) < 3:
            assert state_of(client.get("local-try")) == "Running", list(client.logs("local-try", follow=False))
            assert time.monotonic() < deadline, "no third step within 300 s"
            time.sleep(0.2)
        suspended = client.suspend("local-try")
        assert suspended.status is not None and suspended.status.state == "Suspended"
        stopped_at = _step(suspended)
        assert 3 <= stopped_at < STEPS
        timed_out = r"timed out after 0\.5s waiting for local-try to be Succeeded: it is Suspended"
        with pytest.raises(WaitTimeout, match=timed_out):
            client.wait("local-try", timeout=0.5)
        client.resume("local-try")
        seen: list[int] = []
        done = client.wait("local-try", "Succeeded", timeout=300, on_progress=lambda j: seen.append(_step(j)))
        assert done.status is not None and done.status.result is not None
        assert done.status.result.steps == STEPS and done.status.progress is not None
        assert done.status.progress.summary == f"{STEPS}/{STEPS} (100%)"
        assert seen == sorted(seen) and seen[-1] == STEPS
        log = list(client.logs("local-try", rank=1, follow=True))  # ended: returns what there is
        assert any(f"stopped at the boundary of step {stopped_at} of {STEPS}" in line for line in log), log[-30:]
        train_log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
        assert [e["step"] for e in train_log if "loss" in e] == list(range(1, STEPS + 1))  # resumed: no step twice
        assert [j.name for j in client.list()] == ["local-try"] and client.events("local-try") == []
        client.delete("local-try")
        with pytest.raises(JobNotFound):
            client.get("local-try")
        assert (out / "adapter").is_dir()  # the output stays, as a claim does


def _step(job: FineTuneJob) -> int:
    return job.status.progress.step if job.status and job.status.progress else 0
