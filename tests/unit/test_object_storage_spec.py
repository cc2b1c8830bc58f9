"""s3:// URIs in the API and in what the operator renders: accepted where a URI is, refused
when malformed (naming the field), credentials only through secretKeyRef, the operator's
defaults under the job's settings, a scratch volume instead of a shared claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.api.model_uri import hub_model
from finetune_operator.api.object_storage import ConfigMapKey, ObjectStorageSpec
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.cli.main import main
from finetune_operator.plan import fixed_plan
from finetune_operator.plan.admission.storage import SharedStorageError, check_shared_storage, written_claims
from finetune_operator.render.manifests import render_all
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document, make_job

pytestmark = pytest.mark.timeout(30)

S3_MODEL = {"uri": "s3://models/base/tiny", "architecture": "meta-llama/Llama-3.1-8B"}
CREDS = {"objectStorage": {"credentials": {"secretName": "s3-keys"}, "endpoint": "http://127.0.0.1:8333"}}


def s3_job(**overrides: Any) -> Any:
    spec = {
        "model": S3_MODEL,
        "dataset": {"uri": "s3://data/train.jsonl", "validationUri": "s3://data/eval.jsonl"},
        "output": {"uri": "s3://runs/team/job-1"},
        "resources": {"numNodes": 2, "gpusPerNode": 8},
        **CREDS,
    }
    spec.update(overrides)
    return make_job(**spec)


def problems(tmp_path: Path, capsys: pytest.CaptureFixture[str], **spec: Any) -> list[str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_document(**spec)))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err.splitlines()
    assert (code == 0) == (not err), err
    return err


def test_s3_uris_are_accepted_for_model_data_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = s3_job()
    assert set(job.spec.s3_uris) == {
        "spec.model.uri",
        "spec.dataset.uri",
        "spec.dataset.validationUri",
        "spec.output.uri",
    }
    assert problems(tmp_path, capsys, **job.model_dump(mode="json", by_alias=True, exclude_none=True)["spec"]) == []


@pytest.mark.parametrize(
    ("field", "spec"),
    [
        ("spec.model.uri", {"model": {"uri": "s3://"}}),
        ("spec.model.uri", {"model": {"uri": "s3://bucket"}}),  # a bucket alone is no location
        ("spec.dataset.uri", {"dataset": {"uri": "s3://Bad_Bucket/x.jsonl"}}),
        ("spec.dataset.validationUri", {"dataset": {"validationUri": "s3://ab/x.jsonl"}}),  # 2 characters
        ("spec.output.uri", {"output": {"uri": "s3://bucket/"}}),
        ("spec.output.uri", {"output": {"uri": "s3://bucket/a/../../other"}}),
        ("spec.objectStorage.endpoint", {"objectStorage": {"endpoint": "s3.example.com"}}),
    ],
)
def test_malformed_s3_settings_are_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, spec: dict[str, Any]
) -> None:
    lines = problems(tmp_path, capsys, **{**CREDS, **spec})
    assert any(f": {field}" in line or line.startswith(field) for line in lines), lines


def test_an_s3_uri_needs_credentials_or_a_service_account(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = problems(tmp_path, capsys, output={"uri": "s3://runs/job"})
    assert any("spec.objectStorage" in line and "credentials" in line for line in lines), lines
    both = {"credentials": {"secretName": "k"}, "serviceAccountName": "trainer"}
    lines = problems(tmp_path, capsys, output={"uri": "s3://runs/job"}, objectStorage=both)
    assert any("spec.objectStorage.serviceAccountName" in line for line in lines), lines


def test_rules_agree_with_pydantic() -> None:
    with pytest.raises(ValueError, match="objectStorage"):
        FineTuneJobSpec.from_wire(job_document(output={"uri": "s3://runs/job"})["spec"])


def pod_of(job: Any, options: RenderOptions | None = None) -> dict[str, Any]:
    objects = render_all(job, fixed_plan(job.spec), options or RenderOptions(), replicas=2)
    workers = next(o for o in objects if o["kind"] == "StatefulSet")
    return dict(workers["spec"]["template"]["spec"])


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


def test_keys_reach_the_pod_only_through_secret_key_refs() -> None:
    pod = pod_of(s3_job())
    env = env_of(pod)
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert env["FTJOB_S3_CREDENTIALS_SECRET"] == "s3-keys"  # the name, for the trainer's messages
    assert env["FTJOB_S3_ENDPOINT"] == "http://127.0.0.1:8333"
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False


def test_output_on_s3_stages_on_a_scratch_volume_sized_by_the_plan() -> None:
    job = s3_job()
    pod = pod_of(job)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "persistentVolumeClaim" not in json.dumps(volumes)  # no claim at all
    assert volumes["scratch"]["emptyDir"]["sizeLimit"].endswith("Gi")
    assert env_of(pod)["FTJOB_OUTPUT_DIR"].startswith(mounts["scratch"] + "/")
    # s3:// inputs are mirrored into the model cache, which the ephemeral request covers with the scratch
    assert env_of(pod)["FTJOB_S3_MIRROR"].startswith(mounts["model-cache"] + "/")
    storage = pod["containers"][0]["resources"]["requests"]["ephemeral-storage"]
    assert storage.endswith("Mi") and int(storage[:-2]) > 100 * 1024


def test_a_multi_node_job_with_output_on_s3_writes_no_shared_claim() -> None:
    job = s3_job()
    assert written_claims(job.spec) == {}
    check_shared_storage(job.spec, {})
    on_claim = make_job(resources={"numNodes": 2})
    with pytest.raises(SharedStorageError, match="s3://bucket/prefix"):
        check_shared_storage(on_claim.spec, {"out": ("ReadWriteOnce",)})


def test_operator_defaults_fill_what_the_job_leaves_unset() -> None:
    defaults = ObjectStorageSpec(
        endpoint="https://s3.internal:9000",
        region="eu-1",
        path_style=True,
        ca_bundle=ConfigMapKey(name="ca", key="pem"),
    )
    job = s3_job(objectStorage={"credentials": {"secretName": "s3-keys"}, "region": "us-west-2"})
    pod = pod_of(job, RenderOptions(object_storage=defaults))
    env = env_of(pod)
    assert env["FTJOB_S3_ENDPOINT"] == "https://s3.internal:9000" and env["FTJOB_S3_REGION"] == "us-west-2"
    assert env["FTJOB_S3_PATH_STYLE"] == "true"
    ca = next(v for v in pod["volumes"] if v["name"] == "s3-ca")
    assert ca["configMap"] == {"name": "ca", "items": [{"key": "pem", "path": "ca.crt"}]}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "s3-ca")
    assert env["AWS_CA_BUNDLE"] == mount["mountPath"] + "/ca.crt"


def test_workload_identity_sets_the_pods_service_account_and_no_keys() -> None:
    pod = pod_of(s3_job(objectStorage={"serviceAccountName": "trainer-s3"}))
    assert pod["serviceAccountName"] == "trainer-s3"
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env_of(pod))


def test_a_users_own_env_wins_without_a_duplicate() -> None:
    pod = pod_of(s3_job(env=[{"name": "FTJOB_S3_ENDPOINT", "value": "http://other:1"}]))
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert names.count("FTJOB_S3_ENDPOINT") == 1 and env_of(pod)["FTJOB_S3_ENDPOINT"] == "http://other:1"


def test_jobs_without_s3_render_as_before() -> None:
    pod = pod_of(make_job())
    assert not any(name.startswith(("FTJOB_S3", "AWS_")) for name in env_of(pod))
    assert {v["name"] for v in pod["volumes"]}.isdisjoint({"scratch", "s3-ca"})


def test_planning_an_s3_model_asks_for_its_architecture() -> None:
    from finetune_operator.plan.errors import UnknownArchitectureError
    from finetune_operator.plan.sources.model_source import resolve_model

    with pytest.raises(UnknownArchitectureError, match=r"does not read object storage.*model\.architecture"):
        resolve_model(make_job(model={"uri": "s3://models/x"}, **CREDS).spec.model)


def test_an_s3_model_is_mirrored_into_an_emptydir_not_downloaded_from_the_hub() -> None:
    assert hub_model("s3://models/base/tiny") is None
    job = s3_job(output={"uri": "pvc://out/run"})
    workers = next(o for o in render_all(job, fixed_plan(job.spec), RenderOptions(), 2) if o["kind"] == "StatefulSet")
    assert "volumeClaimTemplates" not in workers["spec"]  # no per-pod hub cache claim
    pod = pod_of(job)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", "emptyDir": {"sizeLimit": "100Gi"}}
    env = env_of(pod)
    assert "FTJOB_PREFETCH_MODEL" not in env and not env["HF_HOME"].startswith("/var/cache/ftjob")
    assert pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "100Gi"
    sized = pod_of(s3_job(output={"uri": "pvc://out/run"}, model={**S3_MODEL, "cache": {"size": "30Gi"}}))
    assert {v["name"]: v for v in sized["volumes"]}["model-cache"]["emptyDir"] == {"sizeLimit": "30Gi"}


def test_a_hub_model_with_s3_data_mirrors_into_its_cache_claim() -> None:
    job = s3_job(model={"uri": "meta-llama/Llama-3.1-8B"}, output={"uri": "pvc://out/run"})
    workers = next(o for o in render_all(job, fixed_plan(job.spec), RenderOptions(), 2) if o["kind"] == "StatefulSet")
    (claim,) = workers["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "model-cache" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    pod = pod_of(job)
    assert "model-cache" not in {v["name"] for v in pod["volumes"]}  # the claim template provides it
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    env = env_of(pod)
    assert env["FTJOB_S3_MIRROR"].startswith(mounts["model-cache"] + "/") and env["FTJOB_PREFETCH_MODEL"] == "1"
    assert "ephemeral-storage" not in pod["containers"][0]["resources"].get("requests", {})


def test_s3_inputs_use_a_named_cache_claim() -> None:
    model = {**S3_MODEL, "cache": {"claimName": "mirror"}}
    pod = pod_of(s3_job(model=model, output={"uri": "pvc://out/run"}))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "mirror"}
    assert "ephemeral-storage" not in pod["containers"][0]["resources"].get("requests", {})
