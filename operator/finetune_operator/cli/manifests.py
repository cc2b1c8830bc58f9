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
from .apiserver_view import as_stored, metadata_problems


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML speaks YAML 1.1, where `2e-4` and `0o17` are strings; kubectl reads a float and
    the integer 15 (Go's integer syntax)."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+0123456789."),
)
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?0o[0-7_]+$"), list("-+0"))


MAX_FILE_BYTES = 3 * 1024 * 1024
"""The apiserver refuses a request body over 3 MiB (413); nothing bigger can be applied."""
MAX_EXPANDED_NODES = 100_000
"""Values a document may hold once its YAML aliases are expanded: a FineTuneJob has a few
hundred; an alias bomb (each alias a list of aliases) has millions from a few lines."""


class ManifestError(ValueError):
    """A file that cannot be read as manifests at all; the message is one line for the user."""


class _CountingLoader(_Yaml12Loader):
    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
        return super().compose_node(parent, index)


def _expanded_size(doc: Any, limit: int) -> int:
    """How many values `doc` holds with shared (aliased) parts counted each time they appear,
    counted up to `limit` + 1 at most: never more work than that, whatever the document."""
    count, stack = 0, [doc]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def parse_yaml_documents(text: str) -> list[Any]:
    """All documents of a YAML stream, numbers resolved the way kubectl resolves them.

    Raises yaml.YAMLError for bad YAML and ManifestError for what no apiserver would take:
    excessive aliasing or nesting deeper than the parser can follow.
    """
    loader = _CountingLoader(text)
    try:
        documents = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            documents.append(loader.get_data())
    except RecursionError:
        raise ManifestError("nested too deep to parse (a FineTuneJob needs about a dozen levels)") from None
    finally:
        loader.dispose()
    if loader.aliases and any(_expanded_size(d, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES for d in documents):
        raise ManifestError(
            f"excessive aliasing: {loader.aliases} YAML aliases expand to more than {MAX_EXPANDED_NODES:,} values"
        )
    return documents


def _read_text(path: str) -> str:
    """The file as UTF-8 text, or ManifestError (too big for the apiserver, not UTF-8)."""
    import sys

    if path == "-":
        raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    else:
        with Path(path).open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        mib = MAX_FILE_BYTES // (1024 * 1024)
        raise ManifestError(f"larger than {mib} MiB: the apiserver refuses requests this big")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}") from None


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
        text = _read_text(path)
        documents = parse_yaml_documents(text)
    except OSError as exc:
        out.problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return out
    except ManifestError as exc:
        out.problems.append(f"{path}: {exc}")
        return out
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
        refused = metadata_problems(doc)
        if refused:
            out.problems.extend(f"{_where(path, index, doc)}: {line}" for line in refused)
            continue
        try:
            out.jobs.append(FineTuneJob.from_manifest(as_stored(doc)))
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
