"""A rank's exporter counts the object store's failed attempts (finetune_object_storage_failed_attempts_total).

The real boto3 client calls an endpoint where nothing listens, under a 2 s retry deadline: every
refused connection is one transient attempt, counted and exported by the collector the rank's
registry holds; refused credentials count as denied; a missing object (a probe's answer) is not
counted.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry

from finetune_localcluster.ports import free_port
from finetune_trainer.metrics.rank import RankMetrics
from finetune_trainer.storage.objstore import (
    FAILED_ATTEMPTS,
    Connection,
    ObjectStore,
    S3Uri,
    StoreAccessDenied,
    StoreNotFound,
    StoreUnavailable,
)

pytestmark = pytest.mark.timeout(60)
NAME = "finetune_object_storage_failed_attempts_total"


def exported(registry: CollectorRegistry, kind: str) -> float:
    value = registry.get_sample_value(NAME, {"kind": kind})
    assert value is not None, f"no {NAME}{{kind={kind!r}}}: every kind exists from the start"
    return value


def test_failed_attempts_reach_the_ranks_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    registry = CollectorRegistry()
    RankMetrics(registry, {"rank": "0"}, on_gpu=False, planned={}, comm=False)
    start = {kind: exported(registry, kind) for kind in ("transient", "denied")}

    dead = ObjectStore(Connection(endpoint=f"http://127.0.0.1:{free_port()}", path_style=True, retry_seconds=2))
    with pytest.raises(StoreUnavailable) as caught:
        dead.list(S3Uri.parse("s3://bucket/job/checkpoints"))
    attempts = int(str(caught.value).split("(")[1].split(" attempts")[0])
    assert attempts >= 2
    assert exported(registry, "transient") == start["transient"] + attempts

    def refuse() -> None:
        raise ClientError({"Error": {"Code": "InvalidAccessKeyId", "Message": "no"}}, "ListObjectsV2")

    def missing() -> None:
        raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "no"}}, "GetObject")

    with pytest.raises(StoreAccessDenied):
        dead.call("listing", refuse)
    with pytest.raises(StoreNotFound):
        dead.call("reading", missing)
    assert exported(registry, "denied") == start["denied"] + 1
    assert exported(registry, "transient") == start["transient"] + attempts
    assert FAILED_ATTEMPTS.snapshot()["transient"] == exported(registry, "transient")
