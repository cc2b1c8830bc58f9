"""A real S3-compatible server on loopback: SeaweedFS's `weed server -s3`, for tests and demos.

Why: the object-storage paths of the trainer (uploads, manifests, retention, resume, faults)
must be tested against a real S3 implementation, not a mock. SeaweedFS (Apache-2.0) runs its
master, volume server, filer and S3 gateway in one process; it is built from Go modules and
cached like the Kubernetes binaries (`ensure_binaries(s3=True, core=False)`).

Every one of its listeners gets a free port on 127.0.0.1 (gRPC ports are chosen too: weed's
default is the HTTP port + 10000, which may be taken). Static credentials come from an S3
identities file. `stop()` and `start()` keep the data folder, so a test can take the server
away for a while and bring it back with every object it held.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_localcluster.binaries import ensure_binaries
from finetune_localcluster.ports import free_port

READY_TIMEOUT_S = 90.0


@dataclass
class S3Server:
    """One `weed server` with an S3 gateway; `endpoint`, `access_key` and `secret_key` to use it."""

    workdir: Path
    access_key: str = field(default_factory=lambda: "FTJOBTEST" + secrets.token_hex(6).upper())
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def _argv(self, weed: Path) -> list[str]:
        p = self.ports
        return [
            str(weed),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={self.workdir / 'data'}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=0",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-s3.config={self.workdir / 's3.json'}",
        ]

    def start(self) -> S3Server:
        """Start (or restart, on the same ports and data) and wait until S3 answers."""
        weed = ensure_binaries(s3=True, core=False).weed
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        identity = {
            "name": "ftjob-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (self.workdir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        if not self.ports:
            names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
            self.ports = {name: free_port() for name in names}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self._argv(weed), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self._wait_ready()
        return self

    def client(self) -> Any:
        """A boto3 client with the server's keys (for fixtures: buckets, uploads, checks)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(region_name="us-east-1", s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            try:
                self.client().list_buckets()
                return
            except Exception as exc:  # not listening yet, or the filer not up behind the gateway
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
        tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
        self.stop()
        raise RuntimeError(f"weed server did not serve S3 on {self.endpoint} ({last}); log tail:\n" + "\n".join(tail))

    def stop(self) -> None:
        """Stop the server (data kept); its process group is killed if it does not exit."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
