"""Tokenised and packed data, prepared once per node and shared by its ranks through memory maps.

Tokenising a dataset is the same work on every rank, so the node's local rank 0 does it
alone: it reads, tokenises, splits and packs exactly as a single process would, and writes
the rows as flat `.npy` arrays into a folder named by a content key. The folder is written
under a temporary name and renamed into place, so a folder with the key's name is always
complete. The other local ranks wait for it (bounded by `FTJOB_DATA_PREPARE_TIMEOUT_S`)
and memory-map the arrays: the rows live once per node in the page cache, not once per
rank. A restart whose storage survived finds the folder and tokenises nothing.

The key hashes everything the rows depend on: the dataset bytes (or the URI for built-in
and hub datasets), the tokenizer's serialised vocabulary and chat template, the data
settings and the source of the data code. A dataset that cannot be used leaves an error
file next to the folder, so the waiting ranks fail with the same message as local rank 0
instead of waiting out the timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from finetune_trainer.atomic_json import write_json_atomic
from finetune_trainer.data.batching import Row, pack, unpacked
from finetune_trainer.data.loading import DataError, DataUnavailable, load_samples, source_files
from finetune_trainer.storage import paths

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.data.formats import Tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
TIMEOUT_ENV = "FTJOB_DATA_PREPARE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 3600.0
POLL_S = 0.2
DEMO_LIMIT = 64
"""Held-out records kept for exact-match evaluation of built-in datasets."""
CODE_FILES = ("data/formats.py", "data/batching.py", "data/loading.py", "data/prepared.py", "data/builtin_datasets.py")
"""Sources whose behaviour shapes the rows: a change to any of them gives a new key."""
_TABLE_PARTS = ("ids", "labels", "row_offsets", "lengths", "length_offsets")


@dataclass(frozen=True)
class DataSettings:
    """Everything of the job spec that decides the training and validation rows."""

    uri: str
    validation_uri: str | None
    fmt: str
    max_seq_length: int
    packing: bool
    skip_malformed: bool
    held_out_fraction: float
    seed: int

    @classmethod
    def of(cls, spec: FineTuneJobSpec) -> DataSettings:
        from finetune_operator.api.spec import MalformedLinePolicy

        d = spec.dataset
        return cls(
            uri=d.uri,
            validation_uri=d.validation_uri,
            fmt=str(d.format),
            max_seq_length=d.max_seq_length,
            packing=d.packing,
            skip_malformed=d.on_malformed_line == MalformedLinePolicy.SKIP,
            held_out_fraction=d.held_out_fraction,
            seed=spec.training.seed,
        )


def split_validation(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, validation) index split."""
    import random

    order = list(range(n))
    random.Random(seed).shuffle(order)
    size = min(n - 1, max(1, round(n * fraction))) if fraction > 0 and n > 1 else 0
    return sorted(order[size:]), sorted(order[:size])


class RowTable(Sequence[Row]):
    """Rows stored as flat arrays (possibly memory-mapped); indexing builds one `Row`."""

    def __init__(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = arrays
        self._ids = arrays["ids"]
        self._labels = arrays["labels"]
        self._row_offsets = arrays["row_offsets"]
        self._lengths = arrays["lengths"]
        self._length_offsets = arrays["length_offsets"]

    @classmethod
    def of(cls, rows: Sequence[Row]) -> RowTable:
        import numpy as np

        def offsets(sizes: Iterator[int]) -> NDArray[Any]:
            return np.concatenate([np.zeros(1, np.int64), np.cumsum(np.fromiter(sizes, np.int64, len(rows)))])

        def flat(values: Iterator[tuple[int, ...]], size: int) -> NDArray[Any]:
            return np.fromiter((x for v in values for x in v), np.int64, size)

        row_offsets = offsets(len(r) for r in rows)
        length_offsets = offsets(len(r.lengths) for r in rows)
        ids = flat((r.input_ids for r in rows), int(row_offsets[-1]))
        if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
            raise ValueError("token ids outside 0..2**31-1 cannot be stored as int32")
        return cls(
            {
                "ids": ids.astype(np.int32),
                "labels": flat((r.labels for r in rows), int(row_offsets[-1])).astype(np.int32),
                "row_offsets": row_offsets,
                "lengths": flat((r.lengths for r in rows), int(length_offsets[-1])).astype(np.int32),
                "length_offsets": length_offsets,
            }
        )

    def __len__(self) -> int:
        return len(self._row_offsets) - 1

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        a, b = int(self._row_offsets[index]), int(self._row_offsets[index + 1])
        c, d = int(self._length_offsets[index]), int(self._length_offsets[index + 1])
        return Row(
            tuple(self._ids[a:b].tolist()), tuple(self._labels[a:b].tolist()), tuple(self._lengths[c:d].tolist())
        )


@dataclass
class PreparedData:
    """The rows of one job as this rank sees them, and where they came from."""

    rows: RowTable
    val_rows: RowTable
    skipped: int
    """Malformed records skipped (training and validation files together)."""
    warnings: list[str]
    demo_records: list[dict[str, Any]]
    """Held-out records of a built-in dataset, for exact-match evaluation (else empty)."""
    folder: Path
    tokenized: bool
    """Whether this process tokenised the dataset (False: it read another process's result)."""
    rows_per_example: int = 1
    """Rows one example holds: 2 for a preference pair (rows 2i and 2i+1: chosen, rejected)."""


def prepare(
    settings: DataSettings, tokenizer: Tokenizer, cache_root: Path, local_rank: int, timeout_s: float | None = None
) -> PreparedData:
    """The rows, tokenised here on local rank 0 when no complete folder for the key exists yet."""
    key = cache_key(settings, tokenizer)
    folder = cache_root / key
    error_file = cache_root / f"{key}.error.json"
    if folder.is_dir():
        log.info("reusing %s tokenised earlier, from %s", settings.uri, folder)
        return _read(folder, tokenized=False)
    if local_rank == 0:
        error_file.unlink(missing_ok=True)  # a transient failure of an earlier attempt; permanent ones recur
        try:
            table, val_table, meta = _build(settings, tokenizer)
        except DataError as exc:
            write_json_atomic(error_file, {"message": str(exc), "transient": isinstance(exc, DataUnavailable)})
            raise
        _publish(folder, table, val_table, meta)
        log.info("tokenised %s once for this node into %s (%d training rows)", settings.uri, folder, len(table))
        return _read(folder, tokenized=True)
    limit = timeout_s if timeout_s is not None else _timeout_from_env()
    deadline = time.monotonic() + limit
    while not folder.is_dir():
        if error_file.is_file():
            problem = json.loads(error_file.read_text())
            kind = DataUnavailable if problem.get("transient") else DataError
            raise kind(str(problem["message"]))
        if time.monotonic() > deadline:
            raise DataUnavailable(
                f"{settings.uri}: local rank 0 did not finish tokenising the dataset into {folder} within "
                f"{limit:.0f}s ({TIMEOUT_ENV}); see its log for why"
            )
        time.sleep(POLL_S)
    log.info("reading %s tokenised by local rank 0 from %s", settings.uri, folder)
    return _read(folder, tokenized=False)


def _timeout_from_env() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        message = f"{TIMEOUT_ENV}={raw!r}: must be a number of seconds (default {DEFAULT_TIMEOUT_S:.0f})"
        raise DataError(message) from None


def _build(settings: DataSettings, tokenizer: Tokenizer) -> tuple[RowTable, RowTable, dict[str, Any]]:
    """Read, tokenise, split and pack: the rows every rank trains on, in global order."""
    data = load_samples(settings.uri, settings.fmt, tokenizer, settings.max_seq_length, settings.skip_malformed)
    held_out = data
    if settings.validation_uri is not None:
        held_out = load_samples(
            settings.validation_uri, settings.fmt, tokenizer, settings.max_seq_length, settings.skip_malformed
        )
    skipped = data.malformed + (held_out.malformed if held_out is not data else 0)
    warnings = [
        f"skipped {loaded.malformed} malformed records; first: {loaded.first_problem}"
        for loaded in {id(data): data, id(held_out): held_out}.values()
        if loaded.malformed
    ]
    k = data.per_example  # a preference example is two rows in a row, chosen then rejected
    if k > 1 and settings.packing:  # the API refuses it too (dataset.packing)
        raise DataError(
            f"{settings.uri}: packing is not allowed with format {settings.fmt}: pairs are rows of their own"
        )
    train_idx, val_idx = split_validation(len(data.samples) // k, settings.held_out_fraction, settings.seed)
    if held_out is not data:
        val_idx = list(range(len(held_out.samples) // k))
    train = [data.samples[i * k + j] for i in train_idx for j in range(k)]
    val = [held_out.samples[i * k + j] for i in val_idx for j in range(k)]
    rows = pack(train, settings.max_seq_length) if settings.packing else unpacked(train)
    demo = [held_out.records[i] for i in val_idx[:DEMO_LIMIT]] if paths.is_builtin(settings.uri) else []
    meta: dict[str, Any] = {"version": FORMAT_VERSION, "skipped": skipped, "warnings": warnings, "demo_records": demo}
    if k > 1:
        meta["rows_per_example"] = k
    return RowTable.of(rows), RowTable.of(unpacked(val)), meta


def _publish(folder: Path, table: RowTable, val_table: RowTable, meta: dict[str, Any]) -> None:
    """Write the folder under a temporary name and rename it into place (first writer wins)."""
    import numpy as np

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.{socket.gethostname()}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for prefix, t in (("train", table), ("val", val_table)):
        for part in _TABLE_PARTS:
            with (staging / f"{prefix}_{part}.npy").open("wb") as fh:
                np.save(fh, t.arrays[part])
                fh.flush()
                os.fsync(fh.fileno())
    with (staging / "meta.json").open("w") as fh:
        json.dump(meta, fh)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        staging.rename(folder)
    except OSError:
        if not folder.is_dir():
            raise
        shutil.rmtree(staging, ignore_errors=True)  # another node sharing the volume published the same key


def _read(folder: Path, tokenized: bool) -> PreparedData:
    import numpy as np

    meta = json.loads((folder / "meta.json").read_text())

    def table(prefix: str) -> RowTable:
        return RowTable({part: np.load(folder / f"{prefix}_{part}.npy", mmap_mode="r") for part in _TABLE_PARTS})

    return PreparedData(
        rows=table("train"),
        val_rows=table("val"),
        skipped=int(meta["skipped"]),
        warnings=list(meta["warnings"]),
        demo_records=list(meta["demo_records"]),
        folder=folder,
        tokenized=tokenized,
        rows_per_example=int(meta.get("rows_per_example", 1)),
    )


# ---- the key -------------------------------------------------------------------------------
def cache_key(settings: DataSettings, tokenizer: Tokenizer) -> str:
    """A hex digest of everything the prepared rows depend on."""
    digest = hashlib.sha256()
    parts: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "settings": asdict(settings),
        "code": _code_digest(),
        "tokenizer": _tokenizer_digest(tokenizer),
        "dataset": _dataset_digest(settings.uri),
        "validation": _dataset_digest(settings.validation_uri) if settings.validation_uri else None,
    }
    digest.update(json.dumps(parts, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def _code_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in CODE_FILES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()


def _dataset_digest(uri: str) -> str:
    """The dataset's bytes for local files; the URI itself for built-in and hub datasets."""
    files = source_files(uri)
    digest = hashlib.sha256(uri.encode())
    for path in files or []:
        with path.open("rb") as fh:
            digest.update(str(path).encode() + b"\0" + hashlib.file_digest(fh, "sha256").digest())
    return digest.hexdigest()


def _tokenizer_digest(tokenizer: Tokenizer) -> str:
    """The vocabulary, merges, normaliser and added tokens (serialised), special tokens and chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body = str(backend.to_str())
    else:
        get_vocab = getattr(tokenizer, "get_vocab", None)
        body = json.dumps(sorted(get_vocab().items())) if get_vocab is not None else repr(tokenizer)
    described = {
        "class": type(tokenizer).__name__,
        "body": hashlib.sha256(body.encode()).hexdigest(),
        "chat_template": str(getattr(tokenizer, "chat_template", None)),
        "bos": str(getattr(tokenizer, "bos_token", None)),
        "eos": str(getattr(tokenizer, "eos_token", None)),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
