"""The trainer pod's environment: one declaration (`api.pod_env`) that the renderers, the CRD's
reserved-name rule and the trainer all follow."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from finetune_operator.api import FineTuneJob
from finetune_operator.api.pod_env import (
    LAUNCHER_SET,
    LOCAL_OVERRIDES,
    OPERATOR_SET,
    OVERRIDABLE,
    RESERVED,
    PodEnv,
)
from finetune_operator.api.spec import RESERVED_ENV
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.render.manifests import render_all
from finetune_operator.render.object_storage import effective
from finetune_operator.render.options import RenderOptions
from tests.factories import make_job

CRD = Path(__file__).resolve().parents[2] / "crds" / "finetune.dev_finetunejobs.yaml"
OPTIONS = RenderOptions(trainer_image="trainer:test", hub_endpoint="https://hub.mirror.example")
TRACKING = {"mlflow": {"trackingUri": "http://mlflow:5000", "secretRef": {"name": "mlflow-auth"}}}
S3 = {
    "endpoint": "https://s3.example:9000",
    "region": "eu-1",
    "pathStyle": True,
    "retryTimeoutSeconds": 600,
    "caBundle": {"name": "corp-ca", "key": "ca.crt"},
    "credentials": {"secretName": "s3-keys"},
}


def _job(uid: str = "u-1", **spec: Any) -> FineTuneJob:
    job = make_job(**spec)
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": uid})})


def _env(job: FineTuneJob) -> list[dict[str, Any]]:
    workers = next(o for o in render_all(job, fixed_plan(job.spec), OPTIONS, 2) if o["kind"] == "StatefulSet")
    env: list[dict[str, Any]] = workers["spec"]["template"]["spec"]["containers"][0]["env"]
    return env


def _rules(node: Any) -> list[str]:
    """Every CEL rule (`x-kubernetes-validations`) in a CRD document."""
    if isinstance(node, list):
        return [rule for item in node for rule in _rules(item)]
    if not isinstance(node, dict):
        return []
    own = [v["rule"] for v in node.get("x-kubernetes-validations", [])]
    return own + [rule for value in node.values() for rule in _rules(value)]


def _jobs_that_render_every_variable() -> list[FineTuneJob]:
    resources = {"numNodes": 2, "gpusPerNode": 8, "cpu": "32"}
    hub = _job(
        model={"uri": "meta-llama/Llama-3.1-8B"},
        hfTokenSecretRef={"name": "hf", "key": "token"},
        resources=resources,
        tracking=TRACKING,
    )
    s3 = _job(
        model={"uri": "s3://models/base/tiny", "architecture": "meta-llama/Llama-3.1-8B"},
        dataset={"uri": "s3://data/train.jsonl"},
        output={"uri": "s3://runs/team/job-1"},
        resources=resources,
        objectStorage=S3,
    )
    assert effective(s3, OPTIONS).ca_bundle is not None
    return [hub, s3]


def test_the_groups_split_the_declaration_without_overlap() -> None:
    """A name in no group, or reserved and overridable at once, has no defined owner."""
    assert all(member.value == member.name for member in PodEnv)
    assert len(RESERVED) == len(set(RESERVED))
    assert not set(RESERVED) & OVERRIDABLE and not LOCAL_OVERRIDES & (OPERATOR_SET | LAUNCHER_SET)
    assert (set(RESERVED) - LAUNCHER_SET) | OVERRIDABLE == OPERATOR_SET
    assert set(PodEnv) == OPERATOR_SET | LAUNCHER_SET | LOCAL_OVERRIDES
    assert PodEnv.FTJOB_TERMINATION_LOG in LOCAL_OVERRIDES


def test_the_reserved_env_and_the_crd_rule_are_the_declarations_reserved_names() -> None:
    """spec.RESERVED_ENV feeds the CEL rule; the committed CRD must list the same names."""
    assert tuple(member.value for member in RESERVED) == RESERVED_ENV
    assert all(type(name) is str for name in RESERVED_ENV)  # plain strings in the CRD's YAML
    rules = [rule for rule in _rules(yaml.safe_load(CRD.read_text())) if "self.name in [" in rule]
    assert len(rules) == 1, rules
    listed = re.fullmatch(r"!\(self\.name in \[(.*)\]\)", rules[0])
    assert listed is not None, rules[0]
    assert [name.strip().strip("'") for name in listed[1].split(",")] == [member.value for member in RESERVED]


def test_the_renderers_write_only_declared_names_and_every_operator_name() -> None:
    """A renderer emitting an undeclared name would bypass the reserved rule and the trainer's reads;
    a declared operator name that no renderer writes is stale."""
    written: set[str] = set()
    for job in _jobs_that_render_every_variable():
        names = [entry["name"] for entry in _env(job)]
        assert all(type(name) is str for name in names)  # `ftjob render` dumps them as YAML
        assert len(names) == len(set(names))
        written |= set(names)
    assert sorted(written - {member.value for member in OPERATOR_SET}) == []
    assert sorted(member.value for member in OPERATOR_SET if member.value not in written) == []


def test_a_users_entry_replaces_every_overridable_default() -> None:
    """Overridable names give way to spec.env (no duplicate key the apiserver would refuse)."""
    for job in _jobs_that_render_every_variable():
        # a URL is what every overridable name takes (HF_ENDPOINT must be one)
        users = [{"name": member.value, "value": "http://mine"} for member in sorted(OVERRIDABLE)]
        spec = job.spec.model_dump(by_alias=True, exclude_none=True)
        mine = _job(**{**spec, "env": users})
        entries = [e for e in _env(mine) if e["name"] in OVERRIDABLE]
        assert entries == [{"name": u["name"], "value": "http://mine"} for u in users], entries
