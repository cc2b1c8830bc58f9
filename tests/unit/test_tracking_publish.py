"""Publishing a job's journal to a real MLflow server: one run per job, every step once, and a
server that is down or hangs costs nothing but a delay.

The server is PyPI's MLflow (sqlite store, artifacts through the server) on loopback, shared by
these tests; outages are made by a TCP gate in front of it (`tests/tcp_gate.py`): refused
connections, or accepted ones that never answer.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster.mlflow_server import MlflowServer
from finetune_trainer.tracking import publisher as publisher_module
from finetune_trainer.tracking.journal import JournalWriter, Record, journal_path
from finetune_trainer.tracking.mlflow_sink import PUBLISHED_TAG, UID_TAG, MlflowSink, RunSpec
from finetune_trainer.tracking.publisher import Publisher
from finetune_trainer.tracking.status import StatusBoard, TrackingStatus, status_path
from tests.tcp_gate import TcpGate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def client(url: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url)


def run_spec(url: str, uid: str, **changes: Any) -> RunSpec:
    base: dict[str, Any] = {
        "tracking_uri": url,
        "experiment": f"exp-{uid}",
        "uid": uid,
        "run_name": "job",
        "params": {"lora.r": "8", "plan.zero_stage": "2"},
        "tags": {"ftjob.job": "job", "ftjob.plan": "ZeRO-2"},
    }
    return RunSpec(**{**base, **changes})


def records(steps: range, value: Callable[[int], float] = float) -> list[Record]:
    return [Record(s, 1_700_000_000_000 + s * 1000, {"loss": value(s), "learning_rate": 0.001}) for s in steps]


def history(url: str, run_id: str, key: str = "loss") -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client(url).get_metric_history(run_id, key))


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def caught_up(publisher: Publisher, step: int) -> Callable[[], bool]:
    return lambda: publisher.published == step


@pytest.fixture(autouse=True)
def client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The HTTP settings the sink gives its process, set (and undone) per test here."""
    from finetune_trainer.tracking.mlflow_sink import HTTP_DEFAULTS

    for key, value in HTTP_DEFAULTS.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "BACKOFF_S", (0.2, 0.5))
    monkeypatch.setattr(publisher_module, "FAILING_AFTER_S", 1.0)
    monkeypatch.setattr(publisher_module, "POLL_S", 0.1)


def board(output: Path) -> StatusBoard:
    return StatusBoard(status_path(output), TrackingStatus())


def test_one_run_per_job_found_again_by_uid_with_the_first_plan_in_params(mlflow_server: MlflowServer) -> None:
    uid = str(uuid.uuid4())
    first = MlflowSink(run_spec(mlflow_server.url, uid))
    assert first.connect() == -1
    replanned = run_spec(
        mlflow_server.url,
        uid,
        params={"lora.r": "8", "plan.zero_stage": "3", "plan.offload_optimizer": "cpu"},
        tags={"ftjob.job": "job", "ftjob.plan": "ZeRO-3, optimizer offload cpu"},
        replan_tags={"ftjob.replan.1": "ZeRO-3, optimizer offload cpu: OOMKilled"},
    )
    second = MlflowSink(replanned)  # the next gang, after an out-of-memory re-plan
    assert second.connect() == -1
    assert second.run_id == first.run_id
    assert second.url.endswith(f"/#/experiments/{first.experiment_id}/runs/{first.run_id}")
    run = client(mlflow_server.url).get_run(first.run_id)
    assert run.data.params == {"lora.r": "8", "plan.zero_stage": "2", "plan.offload_optimizer": "cpu"}
    assert run.data.tags[UID_TAG] == uid and run.data.tags["ftjob.plan"] == "ZeRO-3, optimizer offload cpu"
    assert run.data.tags["ftjob.replan.1"] == "ZeRO-3, optimizer offload cpu: OOMKilled"
    other = MlflowSink(run_spec(mlflow_server.url, str(uuid.uuid4()), experiment=f"exp-{uid}"))
    other.connect()
    assert other.run_id != first.run_id  # another job in the same experiment


def test_every_step_is_published_once_across_gangs_and_a_call_that_failed_after_it_landed(
    mlflow_server: MlflowServer, tmp_path: Path, fast_retries: None
) -> None:
    uid = str(uuid.uuid4())
    journal = journal_path(tmp_path)
    JournalWriter(journal).append(records(range(1, 9)))

    class LostAnswer(MlflowSink):
        """The server stores the batch, the answer is lost: the publisher must not send it again."""

        lost = 0

        def publish(self, batch: list[Record]) -> None:
            super().publish(batch)
            if self.lost < 2:
                self.lost += 1
                raise ConnectionResetError("connection reset while reading the answer")

    first = Publisher(LostAnswer(run_spec(mlflow_server.url, uid)), journal, board(tmp_path)).start()
    wait(lambda: first.published == 8, 60, "the first gang's records")
    first.stop()
    JournalWriter(journal).append(records(range(5, 13), lambda s: 100.0 + s))  # the next gang: only 9..12 are new

    class Counted(MlflowSink):
        def __init__(self, spec: RunSpec) -> None:
            super().__init__(spec)
            self.sent: list[int] = []

        def publish(self, batch: list[Record]) -> None:
            super().publish(batch)
            self.sent.extend(r.step for r in batch)

    sink = Counted(run_spec(mlflow_server.url, uid))
    second = Publisher(sink, journal, board(tmp_path)).start()
    wait(lambda: second.published == 12, 60, "the second gang's records")
    second.stop()
    assert sink.sent == [9, 10, 11, 12]  # the run said what it holds: nothing is sent again
    assert isinstance(first.sink, MlflowSink) and sink.run_id == first.sink.run_id
    assert history(mlflow_server.url, sink.run_id) == [(s, float(s)) for s in range(1, 9)] + [
        (s, 100.0 + s) for s in range(9, 13)
    ]
    assert client(mlflow_server.url).get_run(sink.run_id).data.tags[PUBLISHED_TAG] == "12"


def test_a_server_that_refuses_or_hangs_is_failing_and_gets_everything_when_it_answers(
    mlflow_server: MlflowServer, tmp_path: Path, fast_retries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    uid = str(uuid.uuid4())
    journal = journal_path(tmp_path)
    writer = JournalWriter(journal)
    writer.append(records(range(1, 4)))
    with TcpGate(mlflow_server.port) as gate:
        status = board(tmp_path)
        publisher = Publisher(MlflowSink(run_spec(gate.url, uid)), journal, status).start()
        try:
            wait(lambda: publisher.published == 3, 60, "the records before the outage")
            for mode, steps in (("refuse", range(4, 8)), ("hang", range(8, 12))):
                gate.set(mode)
                writer.append(records(steps))
                wait(lambda: status.snapshot().sinks["mlflow"].failing, 30, f"the sink to report failing ({mode})")
                state = status.snapshot().sinks["mlflow"]
                assert state.reason == ("unreachable" if mode == "refuse" else "timeout"), state
                assert state.pending >= len(steps) and publisher.published in (None, steps.start - 1)
                on_disk = TrackingStatus.read(status_path(tmp_path))
                assert on_disk is not None and on_disk.sinks["mlflow"].failing  # what rank 0's metrics export
                gate.set("open")
                wait(caught_up(publisher, steps.stop - 1), 60, f"the records waiting during '{mode}'")
                # the board is told right after the publish that caught up: wait for it, within a bound
                wait(lambda: not status.snapshot().sinks["mlflow"].failing, 10, f"the sink to recover ({mode})")
        finally:
            publisher.stop()
    sink = publisher.sink
    assert isinstance(sink, MlflowSink)
    assert history(mlflow_server.url, sink.run_id) == [(s, float(s)) for s in range(1, 12)]
    assert [m.step for m in client(mlflow_server.url).get_metric_history(sink.run_id, "learning_rate")] == list(
        range(1, 12)
    )


def test_a_sink_is_on_the_board_before_its_first_answer(tmp_path: Path) -> None:
    """Rank 0's metrics list every configured sink from the start (healthy, nothing published),
    not only once it first answered or failed: a sink that never connects is still visible, and
    a reader of the board never finds a configured sink missing."""
    connecting = threading.Event()
    release = threading.Event()

    class Silent:
        name = "mlflow"

        def connect(self) -> int:
            connecting.set()
            release.wait(30)
            raise ConnectionRefusedError("no server")

        def publish(self, records: list[Record]) -> None:
            raise AssertionError("never connected")

        def finish(self, artifacts: list[tuple[Path, str]], pointers: dict[str, str], failed: bool) -> None: ...

        def mark_failed(self) -> None: ...

    status = board(tmp_path)
    publisher = Publisher(Silent(), journal_path(tmp_path), status).start()
    try:
        assert connecting.wait(10)
        state = status.snapshot().sinks["mlflow"]
        assert (state.failing, state.published_step, state.pending) == (False, -1, 0)
        on_disk = TrackingStatus.read(status_path(tmp_path))
        assert on_disk is not None and on_disk.sinks["mlflow"].published_step == -1
    finally:
        release.set()
        publisher.stop()
