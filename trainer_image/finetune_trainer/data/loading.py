"""Reading records from files, folders, a hub id or the built-in demo, with provenance.

Every record keeps the file and line (JSONL), index (JSON array) or row (Parquet) it came
from, so a malformed one is reported where the user can find it. `onMalformedLine`
decides whether the first problem stops the run or whether it is skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.api.storage_uri import StorageUri
from finetune_trainer.data import builtin_datasets
from finetune_trainer.data.formats import (
    PREFERENCE,
    MalformedRecord,
    Sample,
    Tokenizer,
    tokenize_preference,
    tokenize_record,
)
from finetune_trainer.errors import TrainerError
from finetune_trainer.storage import paths
from finetune_trainer.storage.paths import resolve_uri

SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(TrainerError, RuntimeError):
    """The dataset cannot be used; the message names the file and line."""

    reason = TerminationReason.DATA_ERROR


class DataUnavailable(DataError):
    """The dataset could not be found or fetched (yet): a restart may find it."""

    reason = TerminationReason.DATA_UNAVAILABLE


@dataclass(frozen=True)
class RawRecord:
    where: str
    data: Any


@dataclass
class LoadedData:
    """Tokenised samples in file order, and what was skipped on the way. A preference record gives
    two samples in a row, chosen then rejected (`per_example` 2)."""

    samples: list[Sample] = field(default_factory=list)
    per_example: int = 1
    records: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    empty: int = 0
    first_problem: str | None = None


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:
            raise DataUnavailable(f"{path}: folder holds no .jsonl, .json or .parquet files")
        return found
    if not path.exists():
        raise DataUnavailable(f"{path}: dataset not found")
    return [path]


def source_files(uri: str) -> list[Path] | None:
    """The local files a dataset URI reads, in reading order; None for built-in and hub datasets."""
    if paths.is_builtin(uri):
        return None
    local = resolve_uri(uri)
    return None if local is None else _files(Path(local))


def _read_file(path: Path) -> Iterator[RawRecord]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        for index, row in enumerate(pq.read_table(path).to_pylist()):
            yield RawRecord(f"{path}: row {index + 1}", row)
        return
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        for index, row in enumerate(rows):
            yield RawRecord(f"{path}: record {index + 1}", row)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield RawRecord(f"{path}:{lineno}", json.loads(line))
        except json.JSONDecodeError as exc:
            yield RawRecord(f"{path}:{lineno}", MalformedRecord(f"not valid JSON ({exc.msg} at column {exc.colno})"))


def raw_records(uri: str, seed: int = 1234) -> Iterator[RawRecord]:
    """Records of a dataset URI in a stable order."""
    if paths.is_builtin(uri):
        name = paths.builtin_name(uri)
        for index, row in enumerate(builtin_datasets.builtin_records(name)):
            yield RawRecord(f"{uri}#{index}", row)
        return
    local = resolve_uri(uri)
    if local is None:
        yield from _hub_records(uri)
        return
    for path in _files(Path(local)):
        yield from _read_file(path)


def _hub_records(uri: str) -> Iterator[RawRecord]:
    import datasets

    name = StorageUri.of(uri).location
    try:
        table = datasets.load_dataset(name, split="train")
    except Exception as exc:  # the library raises many kinds; the message is what matters
        raise DataUnavailable(f"{uri}: cannot load dataset from the hub: {type(exc).__name__}: {exc}") from None
    for index, row in enumerate(table):
        yield RawRecord(f"{uri}: row {index + 1}", row)


def load_samples(uri: str, fmt: str, tokenizer: Tokenizer, max_len: int, skip_malformed: bool) -> LoadedData:
    """Tokenise every record; raise DataError on the first malformed one unless skipping."""
    out = LoadedData(per_example=2 if fmt == PREFERENCE else 1)
    for raw in raw_records(uri):
        try:
            if isinstance(raw.data, MalformedRecord):
                raise raw.data
            if not isinstance(raw.data, dict):
                raise MalformedRecord(f"expected a JSON object, got {type(raw.data).__name__}")
            if fmt == PREFERENCE:
                pair = tokenize_preference(raw.data, tokenizer, max_len)
                samples = None if pair is None else [pair.chosen, pair.rejected]
            else:
                sample = tokenize_record(raw.data, fmt, tokenizer, max_len)
                samples = None if sample is None else [sample]
        except MalformedRecord as exc:
            message = f"{raw.where}: malformed {fmt} record: {exc}"
            if not skip_malformed:
                raise DataError(message + " (set dataset.onMalformedLine: Skip to skip such records)") from None
            out.malformed += 1
            out.first_problem = out.first_problem or message
            continue
        if samples is None:
            out.empty += 1
            continue
        out.samples.extend(samples)
        out.records.append(raw.data)
    if not out.samples:
        raise DataError(f"{uri}: no usable records (malformed: {out.malformed}, empty after truncation: {out.empty})")
    return out
