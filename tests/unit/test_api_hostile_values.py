"""Values a careless or hostile tenant writes, refused at apply time by the CRD and by `ftjob validate`
alike, with a message in words naming the field: Secret keys Kubernetes refuses, S3 bucket names S3
refuses, empty key segments, ports past 65535, `..` in a revision, an HF_ENDPOINT that is no URL.

Each case goes through the pydantic model (`ftjob validate`) and through the apiserver emulation
(the generated CRD's structural schema and its CEL rules, with RE2 as the apiserver uses it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.cli.main import main
from tests.crd_schema import ApiserverEmulation
from tests.factories import job_document

pytestmark = pytest.mark.timeout(60)

EMULATION = ApiserverEmulation()
CREDS = {"credentials": {"secretName": "s3-keys"}}


def verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str], **spec: Any) -> tuple[list[str], list[str]]:
    """(`ftjob validate`'s problems, the apiserver emulation's) for a job with `spec` merged in."""
    doc = job_document(**spec)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err.splitlines()
    assert (code == 0) == (not err), err
    return err, EMULATION.problems(doc)


def check_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, words: str, **spec: Any) -> None:
    lines, schema = verdicts(tmp_path, capsys, **spec)
    assert schema, f"the CRD admits what validate refuses: {lines}"
    assert any(field in line and words in line for line in lines), lines
    assert not any("must match" in line for line in lines), lines


def check_admitted(tmp_path: Path, capsys: pytest.CaptureFixture[str], **spec: Any) -> None:
    lines, schema = verdicts(tmp_path, capsys, **spec)
    assert (lines, schema) == ([], [])


SECRET_KEY_FIELDS: list[tuple[str, Any]] = [
    ("spec.hfTokenSecretRef.key", lambda k: {"hfTokenSecretRef": {"name": "hf", "key": k}}),
    ("spec.env[0].valueFrom.secretKeyRef.key",
     lambda k: {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": k}}}]}),
    ("spec.objectStorage.credentials.accessKeyIdKey",
     lambda k: {"objectStorage": {"credentials": {"secretName": "s", "accessKeyIdKey": k}}}),
    ("spec.objectStorage.caBundle.key", lambda k: {"objectStorage": {"caBundle": {"name": "ca", "key": k}}}),
    ("spec.tracking.mlflow.secretRef.tokenKey",
     lambda k: {"tracking": {"mlflow": {"secretRef": {"name": "s", "tokenKey": k}}}}),
]  # fmt: skip


@pytest.mark.parametrize("key", [".", "..", "..x", "...", "a b", "a/b"])
@pytest.mark.parametrize(("field", "spec"), SECRET_KEY_FIELDS, ids=[f for f, _ in SECRET_KEY_FIELDS])
def test_secret_keys_kubernetes_refuses_are_refused_at_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, spec: Any, key: str
) -> None:
    check_refused(tmp_path, capsys, field, "must be a Secret key", **spec(key))


@pytest.mark.parametrize("key", [".x", "x..y", "x.", "_a", "-", "token", "a" * 253])
def test_secret_keys_kubernetes_takes_are_admitted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    check_admitted(tmp_path, capsys, hfTokenSecretRef={"name": "hf", "key": key})


BAD_BUCKETS = [
    "192.168.5.4", "a..b", "xn--bucket", "sthree-bucket", "sthree-configurator", "amzn-s3-demo-bucket",
    "bucket-s3alias", "bucket--ol-s3", "bucket.mrap", "bucket--x-s3", "bucket--table-s3",
]  # fmt: skip


@pytest.mark.parametrize("bucket", BAD_BUCKETS)
@pytest.mark.parametrize("where", ["model", "output"])
def test_bucket_names_s3_refuses_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket: str, where: str
) -> None:
    spec = {"model": {"uri": f"s3://{bucket}/base", "architecture": "meta-llama/Llama-3.1-8B"}}
    if where == "output":
        spec = {"output": {"uri": f"s3://{bucket}/runs/job"}}
    check_refused(tmp_path, capsys, f"spec.{where}.uri", "bucket name", objectStorage=CREDS, **spec)


@pytest.mark.parametrize("bucket", ["abc", "a.b-c", "my-bucket.2", "192.168.5", "a-b--c", "x" * 63, "xn-a", "s3alias"])
def test_bucket_names_s3_takes_are_admitted(tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket: str) -> None:
    check_admitted(tmp_path, capsys, objectStorage=CREDS, output={"uri": f"s3://{bucket}/runs/job"})


@pytest.mark.parametrize("uri", ["s3://bucket//", "s3://bucket///", "s3://bucket//x", "s3://bucket/a//b", "s3://b"])
def test_no_key_segment_of_an_s3_uri_is_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str], uri: str) -> None:
    check_refused(tmp_path, capsys, "spec.output.uri", "s3://bucket/prefix", objectStorage=CREDS, output={"uri": uri})
    check_refused(tmp_path, capsys, "spec.dataset.uri", "s3://bucket/prefix", objectStorage=CREDS, dataset={"uri": uri})


@pytest.mark.parametrize("uri", ["s3://bucket/x", "s3://bucket/x/", "s3://bucket/a/b.c/d"])
def test_s3_prefixes_and_keys_are_admitted(tmp_path: Path, capsys: pytest.CaptureFixture[str], uri: str) -> None:
    check_admitted(tmp_path, capsys, objectStorage=CREDS, output={"uri": uri})


@pytest.mark.parametrize("port", ["0", "65536", "99999", "00080"])
def test_endpoint_ports_outside_1_to_65535_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str
) -> None:
    check_refused(tmp_path, capsys, "spec.objectStorage.endpoint", "1-65535",
            objectStorage={"endpoint": f"http://s3.example.com:{port}"})  # fmt: skip
    check_refused(tmp_path, capsys, "spec.tracking.mlflow.trackingUri", "1-65535",
            tracking={"mlflow": {"trackingUri": f"https://mlflow.example.com:{port}/x"}})  # fmt: skip


@pytest.mark.parametrize("port", ["1", "80", "8333", "65535"])
def test_endpoint_ports_in_range_are_admitted(tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str) -> None:
    check_admitted(tmp_path, capsys, objectStorage={"endpoint": f"http://s3.example.com:{port}"},
             tracking={"mlflow": {"trackingUri": f"http://mlflow:{port}/"}})  # fmt: skip


@pytest.mark.parametrize("revision", ["..", "a..b", "main/../x", "v1.", "../../etc"])
def test_a_revision_never_holds_two_periods_in_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], revision: str
) -> None:
    check_refused(
        tmp_path, capsys, "spec.model.revision", "hub revision", model={"uri": "org/model", "revision": revision}
    )


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "0123abcd", "release-2.1_x"])
def test_revisions_are_admitted(tmp_path: Path, capsys: pytest.CaptureFixture[str], revision: str) -> None:
    model = {"uri": "org/model", "revision": revision, "architecture": "meta-llama/Llama-3.1-8B"}
    check_admitted(tmp_path, capsys, model=model)


@pytest.mark.parametrize(
    "value", ["hf-mirror.com", "ftp://hub", "https://user:pw@hub.example.com", "https://hub:99999", "http://h/a b", ""]
)
def test_hf_endpoint_in_env_must_be_an_http_url(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    check_refused(tmp_path, capsys, "spec.env[0].value", "HF_ENDPOINT must be an http:// or https:// URL",
            env=[{"name": "HF_ENDPOINT", "value": value}])  # fmt: skip


def test_hf_endpoint_mirrors_with_a_path_are_admitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mirror = "https://artifactory.example.com:8443/api/huggingfaceml/hf-remote"
    check_admitted(tmp_path, capsys, env=[{"name": "HF_ENDPOINT", "value": mirror}, {"name": "OTHER", "value": "a b"}])


@pytest.mark.parametrize(
    ("field", "spec", "words"),
    [
        ("spec.queueName", {"queueName": "Team_A"}, "must be a DNS label"),
        ("spec.podTemplate.volumeMounts[0].name", {"podTemplate": {"volumes": [{"name": "x", "emptyDir": {}}],
         "volumeMounts": [{"name": "Bad_Name", "mountPath": "/x"}]}}, "must be a DNS label"),
        ("spec.objectStorage.region", {"objectStorage": {"region": "US_EAST"}}, "must be a region name"),
    ],
)  # fmt: skip
def test_dns_labels_and_regions_each_say_what_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, spec: dict[str, Any], words: str
) -> None:
    lines, _ = verdicts(tmp_path, capsys, **spec)
    (line,) = [line for line in lines if field in line]
    assert words in line
    assert ("region" in line.partition(field)[2]) == (words == "must be a region name"), line
