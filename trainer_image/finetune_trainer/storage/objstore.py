"""The trainer's S3 client: every call retried with backoff, every failure one clear sentence.

A job's `s3://` URIs (model, data, checkpoints, results) all go through `ObjectStore`, a thin
layer over boto3 that adds what the trainer needs and boto3 leaves to its caller:

- one deadline for a whole operation (`retry_timeout_seconds`, from the spec): a dead or slow
  endpoint is retried with exponential backoff until it, then fails as `StoreUnavailable`
  (`DataUnavailable` in the termination message, naming the endpoint and the bucket);
- refused credentials fail at once as `StoreAccessDenied`, naming the Secret they came from;
- messages never carry the keys (boto3's do not; `redact` makes sure of it);
- downloads land under a temporary name and are renamed when complete, so a killed download
  never leaves a file that reads as whole;
- deletions are confined to a prefix the caller owns (`delete(keys, within=...)`), and a key
  never names a local file outside the folder it is copied into (`confined`);
- every failed attempt but a "not found" is tallied by kind in `FAILED_ATTEMPTS` (this
  process's, read by the rank's exporter as `finetune_object_storage_failed_attempts_total`),
  so an alert can tell a store that keeps failing before the deadline ends the job.

Connection settings come from the pod's environment (the operator renders them from
`spec.objectStorage` and its own defaults) and, for `ftjob run`, from the spec itself.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from finetune_operator.api.object_storage import DEFAULT_RETRY_TIMEOUT_SECONDS, ObjectStorageSpec, split_s3
from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.api.pod_env import PodEnv
from finetune_trainer.errors import TrainerError

log = logging.getLogger(__name__)
T = TypeVar("T")

KEY_ENVS = (PodEnv.AWS_ACCESS_KEY_ID, PodEnv.AWS_SECRET_ACCESS_KEY, "AWS_SESSION_TOKEN")

ACCESS_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "InvalidSecurity",
        "AuthorizationHeaderMalformed",
        "403",
        "Forbidden",
    }
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound"})
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0
FAILURE_KINDS = ("transient", "denied")
"""The failed attempts tallied: retried ones, and refused credentials ("missing" answers a probe)."""


class FailedAttempts:
    """Failed attempts of this process's object-store calls, by kind (a counter: it only grows)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {kind: self._counts[kind] for kind in FAILURE_KINDS}


FAILED_ATTEMPTS = FailedAttempts()


class StoreError(TrainerError, RuntimeError):
    """A store operation failed; the message names the endpoint and the object, never a key.
    Unreachable past the retry deadline, not found, or refused: the data is not available."""

    reason = TerminationReason.DATA_UNAVAILABLE
    quoted_text_decides = False


class StoreUnavailable(StoreError):
    """The endpoint did not answer, or kept failing, for the whole retry deadline."""


class StoreAccessDenied(StoreError):
    """The store refused the credentials (or has none to use): retrying cannot help."""

    reason = TerminationReason.STORAGE_ACCESS_DENIED


class StoreNotFound(StoreError):
    """The bucket or object does not exist."""


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str
    """Without a trailing '/'."""

    @classmethod
    def parse(cls, uri: str) -> S3Uri:
        return cls(*split_s3(uri))

    def child(self, rel: str) -> S3Uri:
        return S3Uri(self.bucket, f"{self.key}/{rel.strip('/')}")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class Connection:
    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    ca_bundle: str | None = None
    credentials_secret: str | None = None
    retry_seconds: float = DEFAULT_RETRY_TIMEOUT_SECONDS

    @classmethod
    def from_env(cls, spec: ObjectStorageSpec | None = None) -> Connection:
        """The pod's environment (rendered by the operator with its defaults), else the spec."""
        env = os.environ
        spec = spec or ObjectStorageSpec()
        path_style = env.get(PodEnv.FTJOB_S3_PATH_STYLE)
        retry = env.get(PodEnv.FTJOB_S3_RETRY_SECONDS)
        return cls(
            endpoint=env.get(PodEnv.FTJOB_S3_ENDPOINT) or spec.endpoint,
            region=env.get(PodEnv.FTJOB_S3_REGION) or spec.region,
            path_style=path_style == "true" if path_style else bool(spec.path_style),
            ca_bundle=env.get(PodEnv.AWS_CA_BUNDLE) or None,
            credentials_secret=env.get(PodEnv.FTJOB_S3_CREDENTIALS_SECRET)
            or (spec.credentials.secret_name if spec.credentials else None),
            retry_seconds=float(retry) if retry else float(spec.retry_timeout_seconds or DEFAULT_RETRY_TIMEOUT_SECONDS),
        )

    @property
    def where(self) -> str:
        return self.endpoint or f"AWS S3 ({self.region or 'us-east-1'})"


def confined(root: Path, rel: str) -> Path | None:
    """`root/rel` for `rel`, the part of an object key below a copied prefix, if that is a file
    strictly under `root`; None for a key that would land elsewhere (a `..`, `.` or empty
    segment, a NUL byte, a symbolic link out of `root`). The bucket's keys are its strings: a
    shared or hostile bucket may list `prefix/../../elsewhere`."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") or "\x00" in part for part in parts):
        return None
    local = root.joinpath(*parts)
    resolved, top = local.resolve(), root.resolve()
    return local if resolved.is_relative_to(top) and resolved != top else None


def redact(text: str) -> str:
    """`text` with any credential of this process's environment replaced by `***`."""
    for name in KEY_ENVS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(code or status or "") or None
    return None


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        last = getattr(current, "last_exception", None)  # s3transfer's RetriesExceededError
        current = current.__cause__ or current.__context__ or (last if isinstance(last, BaseException) else None)


def classify(exc: BaseException) -> str:
    """'denied', 'missing' or 'transient' (retried), from boto3's exception and its causes."""
    for cause in _chain(exc):
        name = type(cause).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
            return "denied"
        code = _error_code(cause)
        if code in ACCESS_DENIED_CODES:
            return "denied"
        if code in NOT_FOUND_CODES:
            return "missing"
    return "transient"


def _describe(exc: BaseException) -> str:
    for cause in _chain(exc):
        code = _error_code(cause)
        if code:
            return redact(f"{code}: {cause}")
    return redact(f"{type(exc).__name__}: {exc}")


class ObjectStore:
    """boto3's S3 client with the deadline, classification and confinement described above.

    `client`, `sleep` and `clock` stand in for the real ones in unit tests."""

    def __init__(
        self,
        conn: Connection,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conn, self._sleep, self._clock = conn, sleep, clock
        self.client = client if client is not None else _boto_client(conn)

    # ---- the retry loop ------------------------------------------------------------------
    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run `fn` until it succeeds, a non-transient error, or the deadline."""
        deadline = self._clock() + self.conn.retry_seconds
        delay, attempt = BACKOFF_FIRST, 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:
                kind = classify(exc)
                detail = _describe(exc)
                if kind in FAILURE_KINDS:
                    FAILED_ATTEMPTS.add(kind)
                if kind == "denied":
                    secret = self.conn.credentials_secret
                    source = f"the keys of Secret {secret!r}" if secret else "the pod's credentials"
                    raise StoreAccessDenied(
                        f"{what}: {self.conn.where} refused {source} ({detail}); check the Secret's keys and the "
                        "bucket's policy (spec.objectStorage.credentials)"
                    ) from None
                if kind == "missing":
                    raise StoreNotFound(f"{what}: not found at {self.conn.where} ({detail})") from None
                left = deadline - self._clock()
                if left <= 0:
                    raise StoreUnavailable(
                        f"{what}: {self.conn.where} unreachable or failing for {self.conn.retry_seconds:.0f} s "
                        f"({attempt} attempts; last: {detail})"
                    ) from None
                wait = min(delay * (0.5 + random.random() / 2), left)
                log.warning("%s: %s; retrying in %.1f s", what, detail, wait)
                self._sleep(wait)
                delay = min(delay * 2, BACKOFF_MAX)

    # ---- operations ----------------------------------------------------------------------
    def list(self, prefix: S3Uri) -> dict[str, int]:
        """Key → size of every object under `prefix/` (and `prefix` itself, if it is an object)."""

        def listing() -> dict[str, int]:
            found: dict[str, int] = {}
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=prefix.bucket, Prefix=prefix.key):
                for item in page.get("Contents", []):
                    key = str(item["Key"])
                    if key == prefix.key or key.startswith(prefix.key + "/"):
                        found[key] = int(item["Size"])
            return found

        return self.call(f"listing {prefix}", listing)

    def get_bytes(self, uri: S3Uri) -> bytes:
        return self.call(
            f"reading {uri}", lambda: bytes(self.client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read())
        )

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        self.call(f"writing {uri}", lambda: self.client.put_object(Bucket=uri.bucket, Key=uri.key, Body=data))

    def exists(self, uri: S3Uri) -> bool:
        try:
            self.call(f"checking {uri}", lambda: self.client.head_object(Bucket=uri.bucket, Key=uri.key))
        except StoreNotFound:
            return False
        return True

    def upload(self, path: Path, uri: S3Uri) -> None:
        self.call(
            f"uploading {path.name} to {uri}",
            lambda: self.client.upload_file(str(path), uri.bucket, uri.key, Config=_transfer_config()),
        )

    def download(self, uri: S3Uri, path: Path) -> None:
        """`uri` into `path`, through `path.part-<pid>`: `path` exists only once it is complete."""
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.part-{os.getpid()}")

        def fetch() -> None:
            try:
                self.client.download_file(uri.bucket, uri.key, str(part), Config=_transfer_config())
                os.replace(part, path)
            finally:
                part.unlink(missing_ok=True)

        self.call(f"downloading {uri}", fetch)

    def delete(self, keys: Iterable[str], within: S3Uri) -> int:
        """Delete `keys` (of `within`'s bucket); every one must lie under `within/`: the job's
        own prefix. Returns how many were deleted."""
        batch = sorted(set(keys))
        outside = [k for k in batch if not k.startswith(within.key + "/")]
        if outside:
            raise StoreError(f"refusing to delete {len(outside)} object(s) outside {within}/ (e.g. {outside[0]})")
        for start in range(0, len(batch), 1000):  # the API's limit per request
            chunk = [{"Key": k} for k in batch[start : start + 1000]]
            self.call(
                f"deleting {len(chunk)} object(s) under {within}",
                lambda chunk=chunk: self.client.delete_objects(  # type: ignore[misc]
                    Bucket=within.bucket, Delete={"Objects": chunk, "Quiet": True}
                ),
            )
        return len(batch)


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=64 * 2**20, multipart_chunksize=64 * 2**20, max_concurrency=4)


def _boto_client(conn: Connection) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=conn.region or "us-east-1",
        s3={"addressing_style": "path" if conn.path_style else "virtual"},
        retries={"max_attempts": 1, "mode": "standard"},  # `ObjectStore.call` retries, under one deadline
        connect_timeout=5,
        read_timeout=60,
        # Only what the store needs: newer SDKs add CRC checksums some S3-compatible stores reject.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=conn.endpoint, config=config, verify=conn.ca_bundle)


def store_for(spec: ObjectStorageSpec | None) -> ObjectStore:
    return ObjectStore(Connection.from_env(spec))
