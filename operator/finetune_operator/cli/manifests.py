"""Reading FineTuneJob manifests from files, for every command that takes FILE.

A file may hold several YAML documents; documents of other kinds are reported as
skipped, not as errors, so a whole `kubectl apply -f` bundle can be validated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..api import FineTuneJob, describe, is_finetunejob


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML speaks YAML 1.1, where `2e-4` is a string; kubectl reads it as a float."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+0123456789."),
)


def parse_yaml_documents(text: str) -> list[Any]:
    """All documents of a YAML stream, numbers resolved the way kubectl resolves them."""
    return list(yaml.load_all(text, Loader=_Yaml12Loader))


@dataclass
class Loaded:
    """What one file yielded: valid jobs, problems (one line each), skipped documents."""

    jobs: list[FineTuneJob] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _where(path: str, index: int, doc: dict[str, Any]) -> str:
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return f"{path}[{index}]" + (f" ({name})" if name else "")


def load_jobs(path: str) -> Loaded:
    """Parse every document of a file; never raises for bad content."""
    out = Loaded()
    try:
        text = Path(path).read_text() if path != "-" else __import__("sys").stdin.read()
    except OSError as exc:
        out.problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return out
    try:
        documents = parse_yaml_documents(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        out.problems.append(f"{path}:{where}: not valid YAML: {problem}")
        return out
    for index, doc in enumerate(documents):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            out.problems.append(f"{path}[{index}]: expected a mapping (a Kubernetes object), got {type(doc).__name__}")
            continue
        if not is_finetunejob(doc):
            if doc.get("kind") == "FineTuneJob":
                out.problems.append(
                    f"{_where(path, index, doc)}: apiVersion: must be finetune.dev/v1alpha1 "
                    f"(got {doc.get('apiVersion')!r})"
                )
            else:
                out.skipped.append(f"{_where(path, index, doc)}: {doc.get('kind', 'unknown kind')} (not a FineTuneJob)")
            continue
        try:
            out.jobs.append(FineTuneJob.from_manifest(doc))
        except ValidationError as exc:
            out.problems.extend(f"{_where(path, index, doc)}: {line}" for line in describe(exc, FineTuneJob))
    return out


def load_one(path: str) -> FineTuneJob:
    """The single FineTuneJob in a file, or SystemExit with the problems."""
    loaded = load_jobs(path)
    if loaded.problems:
        raise SystemExit("\n".join(loaded.problems))
    if len(loaded.jobs) != 1:
        raise SystemExit(f"{path}: expected exactly one FineTuneJob, found {len(loaded.jobs)}")
    return loaded.jobs[0]
