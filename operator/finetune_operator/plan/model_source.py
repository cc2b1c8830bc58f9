"""Where a job's model architecture comes from: the built-in catalogue or a local config.json.

There is no hub access where the operator runs, so common open models ship as data
(`catalogue/*.json`, copies of their config.json with a `_names` list of hub ids and
aliases). A local directory holding config.json works as well, which is how
`model.uri: /abs/path` and `model.architecture: /abs/path` plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ..api.catalogue import CATALOGUE_DIR
from ..api.spec import ModelSpec
from .errors import ModelConfigNotFoundError, UnknownArchitectureError


@dataclass(frozen=True)
class ModelSource:
    """A model's config.json (without the catalogue's private `_` keys) and where it came from."""

    name: str
    config: dict[str, Any] = field(hash=False, compare=False)
    origin: str

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))


def _public_keys(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in raw.items() if not key.startswith("_")}


@cache
def _catalogue() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every lookup key (entry stem and each `_names` item, lower-cased) → (stem, names)."""
    index: dict[str, tuple[str, tuple[str, ...]]] = {}
    for path in sorted(CATALOGUE_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        names = tuple(str(n) for n in raw.get("_names", []))
        for key in (path.stem, *names):
            index[key.lower()] = (path.stem, names)
    return index


def catalogue_entries() -> list[str]:
    """The catalogue's entry names (file stems), sorted."""
    return sorted({stem for stem, _ in _catalogue().values()})


def catalogue_entry(stem: str) -> ModelSource:
    """One catalogue entry by its file stem, e.g. `llama-2-7b`."""
    config = _catalogue_config(stem)
    if config is None:
        raise UnknownArchitectureError(f"no catalogue entry {stem!r}; known: {', '.join(catalogue_entries())}")
    return ModelSource(name=stem, config=dict(config), origin=f"catalogue:{stem}")


@cache
def _catalogue_config(stem: str) -> dict[str, Any] | None:
    """An entry's config, read once: the catalogue ships with the code and never changes under it
    (the operator plans every new job with it; re-reading the file was a fifth of planning)."""
    path = CATALOGUE_DIR / f"{stem}.json"
    if not path.is_file():
        return None
    return _public_keys(json.loads(path.read_text()))


def _from_catalogue(reference: str) -> ModelSource | None:
    key = reference.removeprefix("hf://").lower()
    found = _catalogue().get(key)
    return catalogue_entry(found[0]) if found else None


def _from_directory(path_text: str) -> ModelSource:
    path = Path(path_text)
    config_path = path if path.name == "config.json" else path / "config.json"
    try:
        raw = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ModelConfigNotFoundError(
            f"{config_path} does not exist: point model.uri (or model.architecture) at a directory that "
            "holds the model's config.json, or set model.architecture to a catalogue name "
            f"({', '.join(catalogue_entries())})"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelConfigNotFoundError(f"cannot read {config_path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelConfigNotFoundError(f"{config_path} is not a JSON object")
    return ModelSource(name=str(path), config=_public_keys(raw), origin=str(config_path))


def resolve_reference(reference: str, field: str = "model", local_files: bool = True) -> ModelSource:
    """A catalogue name, hub id (`org/name`, `hf://org/name`), `builtin://...` or absolute path.

    `field` names where the reference came from in messages (e.g. `spec.model.architecture`).
    """
    local = reference.removeprefix("file://")
    if local.startswith("/"):
        return _from_directory(local)
    found = _from_catalogue(reference)
    if found is not None:
        return found
    elsewhere = " or to an absolute path with config.json" if local_files else ""
    hint = f"set model.architecture to one of the catalogue names{elsewhere}"
    unread = {"pvc://": "cannot read pvc:// volumes", "s3://": "does not read object storage"}  # s3: no keys
    for scheme, why in unread.items():
        if reference.startswith(scheme):
            hint = f"the operator {why} while planning: set model.architecture to a catalogue name{elsewhere}"
    raise UnknownArchitectureError(
        f"{field}: {reference!r} is not in the planner's catalogue ({', '.join(catalogue_entries())}); {hint}"
    )


def resolve_model(model: ModelSpec, local_files: bool = True) -> ModelSource:
    """The architecture a job plans with: `model.architecture` when set, else `model.uri`.

    `local_files=False` is the operator: an absolute `model.uri` is a path inside the trainer
    pods, and reading that path on the operator's own filesystem would plan with whatever
    happens to be there (or probe the operator's files), so it asks for `model.architecture`.
    `ftjob plan` and `ftjob run` read it: the trainer runs on the same machine.
    """
    reference = model.architecture or model.uri
    field = "spec.model.architecture" if model.architecture else "spec.model.uri"
    if not local_files and reference.removeprefix("file://").startswith("/"):
        raise UnknownArchitectureError(
            f"{field}: {reference!r} is a path inside the trainer pods, which the operator cannot read "
            "while planning: set spec.model.architecture to a catalogue name "
            f"({', '.join(catalogue_entries())}) or a hub id the catalogue knows"
        )
    return resolve_reference(reference, field, local_files)
