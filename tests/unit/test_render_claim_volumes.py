"""Claims become pod volumes: every claim a URI names is mounted, under a valid, distinct name."""

from __future__ import annotations

import re

import pytest

from finetune_operator.render.volumes import claim_volume_name, volume_mounts, volumes
from tests.factories import make_job

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@pytest.mark.parametrize(
    "claim",
    [
        "data",
        "a" * 59,  # pvc- + 59 = 63: still the plain name
        "a" * 60,  # one over: cut and hashed
        "x" * 58 + "-" + "y" * 20,  # a cut that would end in '-'
        "team.datasets.v2",  # claim names are subdomains: dots are not allowed in a volume name
        "a" * 253,
    ],
)
def test_every_claim_gets_a_dns_label_volume_name(claim: str) -> None:
    name = claim_volume_name(claim)
    assert DNS_LABEL.fullmatch(name), name
    assert name.startswith("pvc-")


def test_a_short_valid_claim_keeps_its_readable_name() -> None:
    assert claim_volume_name("data") == "pvc-data"
    assert claim_volume_name("a" * 59) == "pvc-" + "a" * 59


def test_two_long_claims_with_one_prefix_get_different_volumes() -> None:
    first, second = "shared-prefix-" + "x" * 60 + "-one", "shared-prefix-" + "x" * 60 + "-two"
    assert f"pvc-{first}"[:63] == f"pvc-{second}"[:63]  # what a plain cut made of them
    assert claim_volume_name(first) != claim_volume_name(second)


def test_a_job_with_colliding_claims_renders_one_volume_per_claim_and_mounts_each() -> None:
    data, out = "d" * 70 + "-data", "d" * 70 + "-out"
    job = make_job(dataset={"uri": f"pvc://{data}/train.jsonl"}, output={"uri": f"pvc://{out}/run"})
    claim_volumes = [v for v in volumes(job, "cm") if "persistentVolumeClaim" in v]
    assert sorted(v["persistentVolumeClaim"]["claimName"] for v in claim_volumes) == sorted([data, out])
    names = {v["name"] for v in claim_volumes}
    assert len(names) == 2
    mounts = {m["mountPath"]: m["name"] for m in volume_mounts(job, "/etc/ftjob") if m["name"] in names}
    assert set(mounts) == {f"/mnt/pvc/{data}", f"/mnt/pvc/{out}"}


def test_a_validation_file_on_its_own_claim_is_mounted_read_only() -> None:
    job = make_job(dataset={"uri": "pvc://data/train.jsonl", "validationUri": "pvc://heldout/val.jsonl"})
    by_claim = {v["persistentVolumeClaim"]["claimName"]: v for v in volumes(job, "cm") if "persistentVolumeClaim" in v}
    assert by_claim["heldout"]["persistentVolumeClaim"]["readOnly"] is True
    assert {"name": "pvc-heldout", "mountPath": "/mnt/pvc/heldout", "readOnly": True} in volume_mounts(job, "/x")


def test_an_adapter_to_start_from_is_mounted_read_only_and_a_shared_output_claim_stays_writable() -> None:
    job = make_job(model={"uri": "pvc://models/base", "adapter": "pvc://sft-runs/sft/adapter"})
    by_claim = {v["persistentVolumeClaim"]["claimName"]: v for v in volumes(job, "cm") if "persistentVolumeClaim" in v}
    assert by_claim["sft-runs"]["persistentVolumeClaim"]["readOnly"] is True
    assert {"name": "pvc-sft-runs", "mountPath": "/mnt/pvc/sft-runs", "readOnly": True} in volume_mounts(job, "/x")
    # DPO after SFT on one output claim: the claim the adapter is read from is also written to
    out = job.spec.output.uri.removeprefix("pvc://").partition("/")[0]
    same = make_job(model={"uri": "pvc://models/base", "adapter": f"pvc://{out}/sft/adapter"})
    shared = [v for v in volumes(same, "cm") if v.get("persistentVolumeClaim", {}).get("claimName") == out]
    assert len(shared) == 1 and shared[0]["persistentVolumeClaim"]["readOnly"] is False
