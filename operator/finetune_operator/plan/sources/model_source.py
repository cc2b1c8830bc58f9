"""Where a job's model architecture comes from: its own config.json, or the built-in catalogue.

The operator reads a hub model's config.json from the hub and a claim's through an inspector pod
(`reconcile/model_sources.py`), and hands it in as a `ModelSource`. Without one (`ftjob plan`
offline, a hub the operator cannot reach, `model.architecture` set), common open models ship
as data (`catalogue/*.json`, copies of their config.json with a `_names` list of hub ids and
aliases): an offline fallback, not a whitelist. A local directory holding config.json works as
well, which is how `model.uri: /abs/path` and `model.architecture: /abs/path` plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from finetune_operator.api.catalogue import CATALOGUE_DIR
from finetune_operator.api.model_inspection import ModelInspection
from finetune_operator.api.model_uri import hub_model
from finetune_operator.api.spec import ModelSpec
from finetune_operator.api.storage_uri import Scheme, StorageUri
from finetune_operator.plan.errors import ModelConfigNotFoundError, UnknownArchitectureError


@dataclass(frozen=True)
class ModelSource:
    """A model's config.json (without the catalogue's private `_` keys) and where it came from."""

    name: str
    config: dict[str, Any] = field(hash=False, compare=False)
    origin: str
    weight_bytes: int | None = field(default=None, compare=False)
    """Bytes of the files a pod downloads, when read from the files (None: count them from the config)."""

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
    named = StorageUri.of(reference)
    key = (named.location if named.scheme is Scheme.HUB else reference).lower()
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
    named = StorageUri.of(reference)
    if named.scheme is Scheme.PATH and named.path.startswith("/"):
        return _from_directory(named.path)
    found = _from_catalogue(reference)
    if found is not None:
        return found
    elsewhere = " or to an absolute path with config.json" if local_files else ""
    hint = f"set model.architecture to one of the catalogue names{elsewhere}"
    unread = {
        Scheme.CLAIM: "this planner cannot read pvc:// volumes (the operator reads them through an inspector pod)",
        Scheme.S3: "the operator does not read object storage while planning",  # it holds no S3 keys
    }
    why = unread.get(named.scheme)
    if why is not None:
        hint = f"{why}: set model.architecture to a catalogue name{elsewhere}"
    raise UnknownArchitectureError(
        f"{field}: {reference!r} is not in the planner's catalogue ({', '.join(catalogue_entries())}); {hint}"
    )


def from_inspection(inspection: ModelInspection) -> ModelSource:
    """The source a successful inspection (hub read or inspector pod) found."""
    if inspection.config is None:
        raise ModelConfigNotFoundError(inspection.message or f"{inspection.origin}: no config.json")
    return ModelSource(
        name=inspection.origin.removeprefix("hub:"),
        config=_public_keys(inspection.config),
        origin=inspection.origin,
        weight_bytes=inspection.weight_bytes,
    )


def resolve_model(model: ModelSpec, local_files: bool = True, source: ModelSource | None = None) -> ModelSource:
    """The architecture a job plans with: `source` when the caller read the model's own config.json,
    else `model.architecture` when set, else `model.uri`.

    `local_files=False` is the operator: an absolute `model.uri` is a path inside the trainer
    pods, and reading that path on the operator's own filesystem would plan with whatever
    happens to be there (or probe the operator's files), so it asks for `model.architecture`.
    `ftjob plan` and `ftjob run` read it: the trainer runs on the same machine.
    """
    if source is not None:
        return source
    hub = hub_model(model.uri)
    reference = model.architecture or (hub.repo if hub is not None else model.uri)
    field = "spec.model.architecture" if model.architecture else "spec.model.uri"
    named = StorageUri.of(reference)
    if not local_files and named.scheme is Scheme.PATH and named.path.startswith("/"):
        raise UnknownArchitectureError(
            f"{field}: {reference!r} is a path inside the trainer pods, which the operator cannot read "
            "while planning: set spec.model.architecture to a catalogue name "
            f"({', '.join(catalogue_entries())}) or a hub id the catalogue knows"
        )
    return resolve_reference(reference, field, local_files)
