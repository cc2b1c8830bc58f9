"""Where a job's `s3://` URIs are served from, and how its pods prove who they are.

One S3-compatible store per job: `spec.objectStorage` holds the connection (endpoint,
region, path-style addressing, a CA bundle) and the identity of the pods. Each connection
field left unset takes the operator's default (the chart's `objectStorage` values), then
the client's (AWS S3 by region, virtual-hosted addressing, the system CAs).

The identity is either static keys in a Secret, which reach the trainer only through
`secretKeyRef` (the operator never reads a Secret), or a service account for the trainer
pods whose token a workload-identity webhook (IRSA, EKS Pod Identity, GKE/Azure equivalents)
turns into short-lived credentials; the S3 client's default chain picks those up.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from .base import (
    CONTROL_CHARS,
    DNS_SUBDOMAIN_PATTERN,
    PORT,
    SECRET_KEY_HINT,
    SECRET_KEY_PATTERN,
    SPACE_CHARS,
    ApiModel,
)
from .rules import CrossFieldRule

BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
"""The shape of an S3 bucket name: 3 to 63 lowercase letters, digits, '.' and '-', starting and ending
with a letter or digit. `FORBIDDEN_BUCKET` holds the rest of S3's rules, which a pattern without
look-ahead (RE2 has none) cannot say in one piece."""
FORBIDDEN_BUCKET = (
    r"^s3://([^/]*\.\.|[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+/|xn--|sthree-|amzn-s3-demo-"
    r"|[^/]*(-s3alias|--ol-s3|\.mrap|--x-s3|--table-s3)/)"
)
"""An `s3://` URI whose bucket S3 refuses: two adjacent periods, the form of an IP address, a
reserved prefix (`xn--`, `sthree-`, `amzn-s3-demo-`) or a reserved suffix (`-s3alias`, `--ol-s3`,
`.mrap`, `--x-s3`, `--table-s3`). Searched, not matched whole, by Python and by CEL alike."""
FORBIDDEN_BUCKET_MESSAGE = (
    "the bucket name is one S3 refuses: no two adjacent periods, not an IP address, no prefix xn--, sthree- "
    "or amzn-s3-demo-, no suffix -s3alias, --ol-s3, .mrap, --x-s3 or --table-s3"
)
KEY_SEGMENT = f"[^/{CONTROL_CHARS}{SPACE_CHARS}]+"
"""One segment of an object key: never empty, no spaces or control characters."""
S3_URI = rf"s3://{BUCKET_PATTERN}/{KEY_SEGMENT}(/{KEY_SEGMENT})*/?"
"""`s3://bucket/key-or-prefix`: a key (a file) or a prefix (a folder, optionally ending in '/'); the
bucket alone is not a location a job may own, and no segment of the key is empty (`s3://b//` and
`s3://b///` would otherwise be two names of one prefix)."""
ENDPOINT_PATTERN = rf"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:{PORT})?/?$"
REGION_PATTERN = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
"""The language of a DNS label, spelled differently so that `PATTERN_HINTS` can tell the two apart."""

DEFAULT_RETRY_TIMEOUT_SECONDS = 300
"""How long the trainer retries an unreachable or failing store before the run fails."""

PATTERN_HINTS: dict[str, str] = {
    ENDPOINT_PATTERN: "must be an http:// or https:// URL of a host and optional port (1-65535), without a path "
    "(e.g. https://s3.example.com or http://127.0.0.1:8333)",
    REGION_PATTERN: "must be a region name such as us-east-1 (lowercase letters, digits and '-')",
    SECRET_KEY_PATTERN: SECRET_KEY_HINT,
}


def allowed_bucket(field: str, optional: bool = False) -> CrossFieldRule:
    """The rule refusing, in `field` (a uri), an `s3://` bucket name that S3 itself refuses."""
    wire = "".join(part.capitalize() if i else part for i, part in enumerate(field.split("_")))
    cel = f"!self.{wire}.matches('{FORBIDDEN_BUCKET.replace(chr(92), chr(92) * 2)}')"
    return CrossFieldRule(
        cel=f"!has(self.{wire}) || {cel}" if optional else cel,
        message=FORBIDDEN_BUCKET_MESSAGE,
        field_path=f".{wire}",
        check=lambda m: getattr(m, field) is None or re.search(FORBIDDEN_BUCKET, getattr(m, field)) is None,
    )


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key) of an `s3://bucket/key` URI; the key without a trailing '/'."""
    match = re.fullmatch(rf"s3://({BUCKET_PATTERN})/(.+)", uri)
    if match is None:
        raise ValueError(f"{uri!r} is not an s3://bucket/key URI")
    return match.group(1), match.group(2).rstrip("/")


class S3Credentials(ApiModel):
    """Static keys in a Secret of the job's namespace."""

    secret_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] = Field(
        description="The Secret holding the keys. Pods read it through secretKeyRef; the operator never reads it."
    )
    access_key_id_key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)] = Field(
        default="AWS_ACCESS_KEY_ID", description="The Secret's key holding the access key id."
    )
    secret_access_key_key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)] = Field(
        default="AWS_SECRET_ACCESS_KEY", description="The Secret's key holding the secret access key."
    )


class ConfigMapKey(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)]


class ObjectStorageSpec(ApiModel):
    """The S3-compatible store serving the job's `s3://` URIs."""

    endpoint: Annotated[str, Field(max_length=256, pattern=ENDPOINT_PATTERN)] | None = Field(
        default=None,
        description="URL of the S3 API (MinIO, Ceph RGW, SeaweedFS, another cloud). Unset: the operator's "
        "default (chart value objectStorage.endpoint), else AWS S3 of `region`.",
    )
    region: Annotated[str, Field(max_length=64, pattern=REGION_PATTERN)] | None = Field(
        default=None, description="Signing region. Unset: the operator's default, else us-east-1."
    )
    path_style: bool | None = Field(
        default=None,
        description="Address buckets as endpoint/bucket (most on-premises stores) instead of bucket.endpoint. "
        "Unset: the operator's default, else virtual-hosted.",
    )
    ca_bundle: ConfigMapKey | None = Field(
        default=None,
        description="A ConfigMap key (in the job's namespace) holding PEM certificates the endpoint's TLS "
        "certificate chains to. Unset: the operator's default, else the system CAs.",
    )
    credentials: S3Credentials | None = Field(
        default=None, description="Static keys from a Secret (exclusive with serviceAccountName)."
    )
    service_account_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None,
        description="Workload identity: the trainer pods run as this service account, whose token the cluster's "
        "identity webhook exchanges for short-lived credentials (IRSA, EKS Pod Identity). Exclusive with "
        "credentials.",
    )
    retry_timeout_seconds: Annotated[int, Field(ge=10, le=86400)] | None = Field(
        default=None,
        description="How long the trainer retries an unreachable or failing store (with backoff) before the run "
        f"fails with DataUnavailable (default {DEFAULT_RETRY_TIMEOUT_SECONDS}).",
    )
