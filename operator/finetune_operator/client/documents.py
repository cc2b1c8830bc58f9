"""What `submit` accepts, turned into the manifest to create: both backends read it the same way.

A `FineTuneJob`, a bare `FineTuneJobSpec` (with a name), a manifest dict, or a YAML file read
exactly as `ftjob validate` reads it, so a refusal carries the same lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..api import FineTuneJob, FineTuneJobSpec, describe
from ..cli.manifests import load_jobs
from .errors import JobRejected

Submittable = FineTuneJob | FineTuneJobSpec | dict[str, Any] | str | Path


def document_of(job: Submittable, name: str | None) -> dict[str, Any]:
    """The manifest to create, validated by the API's models (JobRejected otherwise)."""
    if isinstance(job, (str, Path)):
        loaded = load_jobs(str(job))
        if loaded.problems:
            raise JobRejected(str(job), loaded.problems)  # each line names the file (and document)
        if len(loaded.jobs) != 1:
            raise JobRejected(str(job), [f"expected exactly one FineTuneJob, found {len(loaded.jobs)}"])
        job = loaded.jobs[0]
    elif isinstance(job, FineTuneJobSpec):
        if not name:
            raise JobRejected("submit", ["metadata.name: required with a bare spec (submit(spec, name=...))"])
        job = FineTuneJob.model_validate(
            {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": name}, "spec": job}
        )
    elif isinstance(job, dict):
        where = str((job.get("metadata") or {}).get("name") or "submit")
        try:
            job = FineTuneJob.from_manifest(job)
        except ValidationError as exc:
            raise JobRejected(where, describe(exc, FineTuneJob)) from None
    document = job.to_wire()
    metadata = {k: v for k, v in document["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    if name:
        metadata["name"] = name
    document["metadata"] = metadata
    return document
