"""The S3 server of the object-storage tests, and small helpers over its bucket.

The server is SeaweedFS (`finetune_localcluster.s3server`), built from Go modules on first use
and started on loopback; the helpers put a test's model and data there and read back what a
run left (committed checkpoints, the adapter).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_localcluster.s3server import S3Server

BUCKET = "ftjob-test"


@contextmanager
def running_s3(workdir: Path) -> Iterator[S3Server]:
    """A started server with `BUCKET` created; stopped on exit."""
    server = S3Server(workdir).start()
    try:
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def upload_folder(client: Any, folder: Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def keys(client: Any, prefix: str) -> dict[str, int]:
    """Key (relative to `prefix/`) -> size of every object under `prefix/`."""
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            found[str(item["Key"])[len(prefix) + 1 :]] = int(item["Size"])
    return found


def committed_steps(client: Any, output_prefix: str) -> list[int]:
    """Steps whose checkpoint folder has its manifest, oldest first."""
    return sorted(
        int(key.split("/")[1].removeprefix("step-"))
        for key in keys(client, output_prefix)
        if key.startswith("checkpoints/step-") and key.endswith("/manifest.json")
    )


def checkpoint_folders(client: Any, output_prefix: str) -> set[str]:
    return {key.split("/")[1] for key in keys(client, output_prefix) if key.startswith("checkpoints/")}


def download_folder(client: Any, prefix: str, target: Path) -> Path:
    for rel in keys(client, prefix):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, f"{prefix}/{rel}", str(target / rel))
    return target


def job_storage(server: S3Server, secret_name: str = "s3-keys") -> dict[str, Any]:
    """`spec.objectStorage` for the server, keys from a Secret named `secret_name`."""
    return {"endpoint": server.endpoint, "pathStyle": True, "credentials": {"secretName": secret_name}}


def key_env(server: S3Server) -> dict[str, str]:
    """The variables the pod's secretKeyRefs would set."""
    return {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
