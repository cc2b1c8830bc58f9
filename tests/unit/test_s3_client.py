"""The S3 client's own logic, without a server: retries under one deadline, classification of
boto3's errors, confinement of deletions, and which checkpoint files exist, are kept, and are
downloaded. (The same code against the real server: tests/trainer/test_s3_checkpoints.py.)"""

from __future__ import annotations

import builtins
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from finetune_localcluster.ports import free_port
from finetune_operator.api.pod_contract import CheckpointFormat, CheckpointState
from finetune_operator.api.strategy import Strategy
from finetune_trainer.checkpoint.s3_checkpoints import Manifest, garbage, needed_files, scan
from finetune_trainer.pod import s3_inputs
from finetune_trainer.storage.objstore import (
    Connection,
    ObjectStore,
    S3Uri,
    StoreAccessDenied,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
    classify,
    redact,
)

pytestmark = pytest.mark.timeout(30)


def client_error(code: str, status: int = 400, message: str = "") -> ClientError:
    body = {"Error": {"Code": code, "Message": message or code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(body, "Op")


class Clock:
    """Time that moves only when the store sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def store(retry_seconds: float = 60.0, secret: str | None = "s3-keys") -> tuple[ObjectStore, Clock]:
    clock = Clock()
    conn = Connection(endpoint="http://127.0.0.1:9", retry_seconds=retry_seconds, credentials_secret=secret)
    return ObjectStore(conn, client=object(), sleep=clock.sleep, clock=lambda: clock.now), clock


def failing(*errors: BaseException, then: Any = "ok") -> Any:
    left = list(errors)

    def call() -> Any:
        if left:
            raise left.pop(0)
        return then

    return call


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "transient"),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), "transient"),
        (client_error("SlowDown", 503), "transient"),
        (client_error("InternalError", 500), "transient"),
        (client_error("InvalidAccessKeyId", 403), "denied"),
        (client_error("SignatureDoesNotMatch", 403), "denied"),
        (client_error("AccessDenied", 403), "denied"),
        (client_error("403", 403), "denied"),  # HEAD answers carry the status only
        (NoCredentialsError(), "denied"),
        (client_error("NoSuchKey", 404), "missing"),
        (client_error("NoSuchBucket", 404), "missing"),
    ],
)
def test_errors_are_classified(error: BaseException, kind: str) -> None:
    assert classify(error) == kind


def test_classification_follows_the_cause_boto3_wraps() -> None:
    try:
        try:
            raise client_error("InvalidAccessKeyId", 403)
        except ClientError:
            raise RuntimeError("Failed to upload x to b/k") from None  # S3UploadFailedError keeps __context__
    except RuntimeError as wrapped:
        wrapped.__context__ = client_error("InvalidAccessKeyId", 403)
        assert classify(wrapped) == "denied"


def test_a_dead_endpoint_is_retried_with_growing_backoff_until_the_deadline() -> None:
    s, clock = store(retry_seconds=30)
    dead = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    with pytest.raises(StoreUnavailable) as caught:
        s.call("uploading x", failing(*[dead] * 1000))
    message = str(caught.value)
    assert "http://127.0.0.1:9" in message and "unreachable or failing for 30 s" in message
    assert clock.now == pytest.approx(30, abs=1e-6)
    growing = clock.sleeps[:-1]  # the last wait is cut to the deadline
    assert all(later >= earlier for earlier, later in itertools.pairwise(growing) if later < 5)
    assert max(clock.sleeps) <= 10.0 and len(clock.sleeps) < 20


def test_an_endpoint_that_comes_back_within_the_deadline_succeeds() -> None:
    s, clock = store(retry_seconds=30)
    dead = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    assert s.call("listing", failing(dead, client_error("SlowDown", 503), dead, then=42)) == 42
    assert len(clock.sleeps) == 3


def test_refused_credentials_fail_at_once_naming_the_secret() -> None:
    s, clock = store()
    with pytest.raises(StoreAccessDenied) as caught:
        s.call("listing s3://b/p", failing(client_error("InvalidAccessKeyId", 403)))
    assert "Secret 's3-keys'" in str(caught.value) and clock.sleeps == []


def test_a_missing_object_is_not_retried() -> None:
    s, clock = store()
    with pytest.raises(StoreNotFound):
        s.call("reading s3://b/k", failing(client_error("NoSuchKey", 404)))
    assert clock.sleeps == []


def test_messages_never_carry_the_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-value-123")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    assert redact("signed with AKIAEXAMPLE / sekrit-value-123") == "signed with *** / ***"
    s, _ = store()
    with pytest.raises(StoreAccessDenied) as caught:
        s.call("x", failing(client_error("SignatureDoesNotMatch", 403, "key AKIAEXAMPLE")))
    assert "AKIAEXAMPLE" not in str(caught.value)


def test_deletions_outside_the_jobs_prefix_are_refused() -> None:
    s, _ = store()
    root = S3Uri("bucket", "team/job/checkpoints")
    for outside in ("team/job/adapter/x", "team/job/checkpoints", "team/job/checkpoints-old/x", "other/x"):
        with pytest.raises(StoreError, match="refusing to delete"):
            s.delete([outside], within=root)


@pytest.mark.parametrize(
    ("text", "bucket", "key"),
    [("s3://b-1.x/p/q/", "b-1.x", "p/q"), ("s3://bkt/data.jsonl", "bkt", "data.jsonl")],
)
def test_uris_parse(text: str, bucket: str, key: str) -> None:
    uri = S3Uri.parse(text)
    assert (uri.bucket, uri.key) == (bucket, key)
    assert str(uri.child("a/b")) == f"s3://{bucket}/{key}/a/b"


CK = S3Uri("b", "job/checkpoints")


def listing(*names: str) -> dict[str, int]:
    return {f"job/checkpoints/{n}": 1 for n in names}


def test_a_checkpoint_without_its_manifest_does_not_exist_and_is_deleted() -> None:
    found = scan(
        listing(
            "step-00000004/manifest.json",
            "step-00000004/trainable_state.pt",
            "step-00000008/manifest.json",
            "step-00000008/trainable_state.pt",
            "step-00000012/trainable_state.pt",  # an upload killed before its commit
        ),
        CK,
    )
    assert found.committed == [4, 8]
    manifests, rest = garbage(found, keep=2)
    assert manifests == [] and rest == ["job/checkpoints/step-00000012/trainable_state.pt"]


def test_retention_drops_old_checkpoints_manifest_first() -> None:
    found = scan(
        listing(*(f"step-0000000{s}/{f}" for s in (2, 4, 6) for f in ("manifest.json", "rng_state_rank0.pt"))),
        CK,
    )
    manifests, rest = garbage(found, keep=1)
    assert manifests == ["job/checkpoints/step-00000002/manifest.json", "job/checkpoints/step-00000004/manifest.json"]
    assert rest == [
        "job/checkpoints/step-00000002/rng_state_rank0.pt",
        "job/checkpoints/step-00000004/rng_state_rank0.pt",
    ]


def test_keys_beside_the_checkpoint_folders_are_never_garbage() -> None:
    found = scan({"job/checkpoints/notes.txt": 1, "job/checkpoints/step-1/x": 1, "job/adapter/a": 1}, CK)
    assert garbage(found, keep=1) == ([], ["job/checkpoints/step-1/x"])
    assert all("notes.txt" not in key for keys in found.keys.values() for key in keys)


TRAINABLE = ["trainable_state.pt", "trainer_state.json", *(f"rng_state_rank{r}.pt" for r in range(4))]
SHARDS = [
    "mp_rank_00_model_states.pt",
    "trainer_state.json",
    *(f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)),
    *(f"rng_state_rank{r}.pt" for r in range(4)),
]


def test_resume_downloads_only_what_a_pods_ranks_read() -> None:
    assert needed_files(TRAINABLE, CheckpointFormat.TRAINABLE, range(2, 4), whole=False) == [
        "rng_state_rank2.pt",
        "rng_state_rank3.pt",
        "trainable_state.pt",
        "trainer_state.json",
    ]
    assert needed_files(SHARDS, CheckpointFormat.DEEPSPEED, range(0, 2), whole=False) == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "mp_rank_00_model_states.pt",
        "rng_state_rank0.pt",
        "rng_state_rank1.pt",
        "trainer_state.json",
    ]
    # shards converted for another strategy: every pod converts them all
    assert needed_files(SHARDS, CheckpointFormat.DEEPSPEED, range(0, 2), whole=True) == sorted(SHARDS)


def test_the_manifest_round_trips() -> None:
    state = CheckpointState(global_step=8).to_file()
    back = Manifest.from_json(Manifest(8, {"a": 1, "b/c": 2}, state).to_json())
    assert back == Manifest(8, {"a": 1, "b/c": 2}, state) and back.checkpoint_state.global_step == 8


def test_mirroring_fetches_only_files_missing_or_of_another_size(tmp_path: Path) -> None:
    uri = S3Uri("b", "models/tiny")
    target = tmp_path / "b/models/tiny"
    (target / "sub").mkdir(parents=True)
    (target / "config.json").write_text("{}")  # 2 bytes: as listed
    (target / "sub" / "w.safetensors").write_text("short")  # a size the listing contradicts
    objects = {"models/tiny/config.json": 2, "models/tiny/sub/w.safetensors": 100, "models/tiny/tok.json": 3}
    todo = s3_inputs.plan_downloads({**objects, "models/tiny/dir/": 0}, uri, target)
    assert todo == [
        ("models/tiny/sub/w.safetensors", target / "sub" / "w.safetensors"),
        ("models/tiny/tok.json", target / "tok.json"),
    ]
    single = S3Uri("b", "data/train.jsonl")
    assert s3_inputs.plan_downloads({"data/train.jsonl": 5}, single, tmp_path / "x.jsonl") == [
        ("data/train.jsonl", tmp_path / "x.jsonl")
    ]


class MemoryStore:
    """The few ObjectStore calls S3Output makes, on a dict; `down` makes uploads fail as a dead
    endpoint does once the retry deadline has passed."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.down = False
        self.conn = Connection(endpoint="http://127.0.0.1:9")

    def list(self, prefix: S3Uri) -> dict[str, int]:
        return {k: len(v) for k, v in self.objects.items() if k.startswith(prefix.key + "/")}

    def upload(self, path: Path, uri: S3Uri) -> None:
        if self.down:
            raise StoreUnavailable(f"uploading {path.name} to {uri}: http://127.0.0.1:9 unreachable or failing")
        self.objects[uri.key] = path.read_bytes()

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        self.objects[uri.key] = data

    def get_bytes(self, uri: S3Uri) -> bytes:
        return self.objects[uri.key]

    def download(self, uri: S3Uri, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.objects[uri.key])

    def delete(self, keys: builtins.list[str], within: S3Uri) -> int:
        for key in keys:
            assert key.startswith(within.key + "/")
            del self.objects[key]
        return len(keys)


class OneRank:
    rank = 0

    def sum(self, values: list[float]) -> list[float]:
        return values

    def barrier(self) -> None:
        pass


def saved(root: Path, step: int) -> None:
    """What `checkpoint.save` leaves on rank 0's pod for a LoRA job."""
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "trainable_state.pt").write_bytes(b"w" * step)
    (folder / "rng_state_rank0.pt").write_bytes(b"r")
    (folder / "trainer_state.json").write_text(CheckpointState(global_step=step).to_file())


def test_a_failed_upload_commits_nothing_and_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    from finetune_trainer.checkpoint.s3_checkpoints import S3Output

    memory = MemoryStore()
    out = S3Output(memory, S3Uri("b", "job"), OneRank(), local_rank=0, local_size=1)  # type: ignore[arg-type]  # a MemoryStore for the ObjectStore
    for step in (4, 8):
        saved(tmp_path, step)
        out.publish(tmp_path, step, keep=1)
    assert sorted(memory.objects) == [
        "job/checkpoints/step-00000008/manifest.json",
        "job/checkpoints/step-00000008/rng_state_rank0.pt",
        "job/checkpoints/step-00000008/trainable_state.pt",
        "job/checkpoints/step-00000008/trainer_state.json",
    ]
    assert not list(tmp_path.iterdir())  # the scratch is freed once committed
    before = dict(memory.objects)
    memory.down = True
    saved(tmp_path, 12)
    intact = r"uploading checkpoint step-00000012 \(the previous committed checkpoint is intact\)"
    with pytest.raises(StoreError, match=intact):
        out.publish(tmp_path, 12, keep=1)
    assert memory.objects == before
    memory.down = False
    assert out.newest() == Manifest.from_json(before["job/checkpoints/step-00000008/manifest.json"])
    staged = tmp_path / "resume"
    strategy = Strategy(
        zero_stage=2,
        offload_optimizer="none",
        offload_params="none",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        world_size=1,
    )
    assert out.stage_newest(staged, strategy) == 8
    assert sorted(p.name for p in (staged / "step-00000008").iterdir()) == [
        "rng_state_rank0.pt",
        "trainable_state.pt",
        "trainer_state.json",
    ]


def test_mirroring_shows_its_progress_on_node_0s_metrics_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """While a pod mirrors its s3:// inputs, the operator's own progress reader sees the bytes
    in the cache grow against the bucket's listing, as for a hub download."""
    import time
    from datetime import UTC, datetime

    from finetune_operator.reconcile.progress import Sample, scrape, to_progress
    from finetune_trainer.pod import prefetch
    from tests.factories import make_job

    port = free_port()
    monkeypatch.setenv("FTJOB_METRICS_PORT", str(port))
    monkeypatch.setenv("FTJOB_POD_IP", "127.0.0.1")
    monkeypatch.setenv("FTJOB_S3_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setattr(prefetch, "POLL_SECONDS", 0.05)
    half_gib = 2**29
    seen: list[str | None] = []

    class SparseStore(MemoryStore):
        """Objects of 0.5 GiB written sparse; the gauges are read after each one lands."""

        def list(self, prefix: S3Uri) -> dict[str, int]:
            if prefix.key == "train.jsonl":
                return {prefix.key: half_gib}
            return {f"{prefix.key}/model-{n}.safetensors": half_gib for n in range(2)}

        def download(self, uri: S3Uri, path: Path) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as blob:
                blob.truncate(half_gib)
            time.sleep(0.3)  # a few polls of the cache
            values = scrape(f"http://127.0.0.1:{port}/metrics")
            assert values is not None, "the mirroring progress is not served"
            seen.append(to_progress(datetime.now(UTC), Sample(0.0, values), None).summary)

    job = make_job(
        model={"uri": "s3://models/base/tiny", "architecture": "meta-llama/Llama-3.1-8B"},
        dataset={"uri": "s3://data/train.jsonl"},
        objectStorage={"credentials": {"secretName": "s3-keys"}, "endpoint": "http://127.0.0.1:9"},
    )
    local = s3_inputs.fetch(job.spec, node_rank=0, store=SparseStore())  # type: ignore[arg-type]
    assert [p.relative_to(tmp_path / "mirror") for p in local] == [Path("models/base/tiny"), Path("data/train.jsonl")]
    assert seen == [
        "downloading model 0.5/1.5 GiB (33%)",
        "downloading model 1.0/1.5 GiB (66%)",
        "downloading model 1.5/1.5 GiB (100%)",
    ]
    assert s3_inputs.fetch(job.spec, node_rank=1, store=SparseStore()) == local  # type: ignore[arg-type]
    assert len(seen) == 3, "a restarted pod with a complete mirror downloads nothing again"


@pytest.mark.parametrize("planted", ["../../../planted", "global_step4/../../../../planted", "a//b", "./x"])
def test_a_manifest_cannot_name_a_file_outside_the_checkpoint(tmp_path: Path, planted: str) -> None:
    """A manifest is text in the bucket: in a shared bucket, a planted one must not place files
    outside the pod's checkpoint folder when the job resumes."""
    from finetune_trainer.checkpoint.s3_checkpoints import S3Output

    memory = MemoryStore()
    out = S3Output(memory, S3Uri("b", "job"), OneRank(), local_rank=0, local_size=1)  # type: ignore[arg-type]  # a MemoryStore for the ObjectStore
    folder = "job/checkpoints/step-00000004"
    state = CheckpointState(global_step=4, checkpoint_format=CheckpointFormat.DEEPSPEED).to_file()
    memory.objects[f"{folder}/{planted}"] = b"x"
    memory.objects[f"{folder}/mp_rank_00_model_states.pt"] = b"m"
    files = {planted: 1, "mp_rank_00_model_states.pt": 1}
    memory.objects[f"{folder}/manifest.json"] = Manifest(4, files, state).to_json()
    staged = tmp_path / "a" / "b" / "ckpt"
    strategy = Strategy(zero_stage=2, offload_optimizer="none", offload_params="none", micro_batch_size=1,
                        gradient_accumulation_steps=1, world_size=1)  # fmt: skip
    with pytest.raises(StoreError, match=f"names {re.escape(repr(planted))}, outside the checkpoint"):
        out.stage_newest(staged, strategy)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_the_tracking_journal_and_event_files_reach_the_bucket_at_each_commit(tmp_path: Path) -> None:
    """With output on s3:// the journal and TensorBoard's event files live on the pod's scratch: each
    commit copies them beside the checkpoints, and a file that grew is sent again."""
    from finetune_trainer.checkpoint import s3_checkpoints
    from finetune_trainer.checkpoint.s3_checkpoints import S3Output

    memory = MemoryStore()
    out = S3Output(memory, S3Uri("b", "job"), OneRank(), local_rank=0, local_size=1)  # type: ignore[arg-type]  # a MemoryStore for the ObjectStore
    scratch = tmp_path / "output"
    journal = scratch / "tracking" / "records.jsonl"
    events = scratch / "tensorboard" / "events.out.tfevents.1.pod-0"
    for path in (journal, events):
        path.parent.mkdir(parents=True)
    journal.write_text('{"step": 4}\n')
    events.write_bytes(b"e" * 4)
    saved(scratch / "checkpoints", 4)
    out.publish(scratch / "checkpoints", 4, keep=1)
    assert memory.objects["job/tracking/records.jsonl"] == b'{"step": 4}\n'
    assert memory.objects["job/tensorboard/events.out.tfevents.1.pod-0"] == b"eeee"
    with journal.open("a") as grown:
        grown.write('{"step": 8}\n')
    saved(scratch / "checkpoints", 8)
    out.publish(scratch / "checkpoints", 8, keep=1)
    assert memory.objects["job/tracking/records.jsonl"].count(b"step") == 2
    assert s3_checkpoints.upload_tracking(memory, S3Uri("b", "job"), scratch) == 2  # type: ignore[arg-type]  # a MemoryStore
    memory.down = True  # tracking never fails training: a dead store is a warning
    assert s3_checkpoints.upload_tracking(memory, S3Uri("b", "job"), scratch) == 0  # type: ignore[arg-type]  # a MemoryStore
