"""`ftjob validate` gives the verdict the cluster gives, on 1,000 generated documents.

The cluster's verdict is the apiserver's (a server-side dry-run create with strict field
validation, as `kubectl apply` sends it) and then the operator's own parse of the object the
apiserver would store (a job it cannot read ends Failed/InvalidSpec). `validate` must accept
exactly the documents both accept, and every refusal must name a field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from finetune_localcluster import Kube, KubeError
from finetune_operator.api import FineTuneJob, describe
from finetune_operator.cli.manifests import load_jobs, parse_yaml_documents
from tests.robustness.documents import generate

DOCUMENTS = 1000
NAMESPACE = "default"
PATH = f"/apis/finetune.dev/v1alpha1/namespaces/{NAMESPACE}/finetunejobs"
# A refusal names where: a field path (spec.x.y, metadata.labels[...]) or the document itself.
NAMES_A_FIELD = re.compile(r"(spec|metadata)(\.|\[)|\.spec\b|\bspec\b|metadata\.name")


def _apiserver(kube: Kube, doc: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    try:
        stored = kube.request("POST", PATH, doc, params={"dryRun": "All", "fieldValidation": "Strict"})
    except KubeError as exc:
        return None, str(exc)
    return stored, ""


def _operator(stored: dict[str, Any]) -> str:
    try:
        FineTuneJob.from_manifest({**stored, "status": None})
    except ValidationError as exc:
        return "; ".join(describe(exc, FineTuneJob))
    return ""


def _validate(doc: dict[str, Any], tmp: Path) -> list[str]:
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    loaded = load_jobs(str(path))
    return loaded.problems if loaded.problems else ([] if len(loaded.jobs) == 1 else ["no job"])


@pytest.mark.slow
def test_validate_agrees_with_the_apiserver_and_the_operator_on_generated_documents(
    robust_kube: Kube, tmp_path: Path
) -> None:
    disagreements: list[str] = []
    unnamed: list[str] = []
    admitted = refused = 0
    for index, (what, doc) in enumerate(generate(DOCUMENTS, seed=20261201)):
        # the apiserver gets what kubectl reads from the file validate reads (YAML 1.2: an unquoted
        # 1e3 in the file is a number to both, as PyYAML's dump leaves the string "1e3")
        as_read = parse_yaml_documents(yaml.safe_dump(doc, sort_keys=False))[0]
        stored, api_error = _apiserver(robust_kube, json.loads(json.dumps(as_read)))
        cluster_error = api_error or _operator(stored or {})
        problems = _validate(doc, tmp_path)
        admitted += not cluster_error
        refused += bool(cluster_error)
        if bool(cluster_error) != bool(problems):
            disagreements.append(
                f"#{index} {what}\n    cluster: {cluster_error or 'accepted'}\n    validate: {problems or 'valid'}"
            )
        for line in problems:
            if not NAMES_A_FIELD.search(line):
                unnamed.append(f"#{index} {what}: {line}")
    print(f"{DOCUMENTS} documents: {admitted} accepted, {refused} refused by the cluster")
    assert admitted > 100 and refused > 100, "the generator no longer covers both verdicts"
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:40])
    assert not unnamed, "refusals that name no field:\n" + "\n".join(unnamed[:40])
