"""Test data factories: a minimal valid FineTuneJob and a way to override any field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from finetune_operator.api import FineTuneJob

REPO_ROOT = Path(__file__).resolve().parents[1]

BASE_JOB: dict[str, Any] = {
    "apiVersion": "finetune.dev/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "job", "namespace": "ns"},
    "spec": {
        "model": {"uri": "meta-llama/Llama-3.1-8B"},
        "dataset": {"uri": "pvc://data/train.jsonl"},
        "output": {"uri": "pvc://out/job"},
    },
}


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is _DELETE:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


_DELETE = object()


def job_document(**spec_overrides: Any) -> dict[str, Any]:
    """A minimal valid FineTuneJob manifest with the spec deep-merged with overrides.

    Keys are wire (camelCase) names; pass `DELETE` as a value to remove a key.
    """
    return _merge(copy.deepcopy(BASE_JOB), {"spec": spec_overrides})


def make_job(**spec_overrides: Any) -> FineTuneJob:
    """A validated FineTuneJob; see `job_document`."""
    return FineTuneJob.from_manifest(job_document(**spec_overrides))


DELETE = _DELETE
