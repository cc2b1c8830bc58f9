"""A shared or hostile bucket cannot write outside the local mirror.

`s3_inputs.mirror` copies every object listed under a job's `s3://` input into the pod's
mirror folder. Object keys are the bucket's strings: `data/../../x`, `data//abs/path`,
`data/./x`, `data/a\\x00b`. Here every generated key goes through the real `mirror` (the real
path joining and download-by-rename) with a store that serves the listing and writes what
`download` asks for; afterwards nothing may exist outside the mirror folder, and a key that
would have escaped (even into another input's copy beside it) is refused by name before any
byte is written.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from finetune_trainer.pod import s3_inputs
from finetune_trainer.storage.objstore import Connection, ObjectStore, S3Uri

pytestmark = pytest.mark.timeout(120)

SEGMENTS = ["..", ".", "", "x", "mnt", "\x00"]
"""Segments a key is built of; at most four `..` in a row, so that even the unconfined code of
before stays inside the test's folder (the mirror lies four levels below it)."""


class ListedStore:
    """What `mirror` asks of a store (list, download), over a listing given by the test."""

    def __init__(self, listing: dict[str, int]) -> None:
        self.listing = listing
        self.conn = Connection(endpoint="http://127.0.0.1:9")

    def list(self, prefix: S3Uri) -> dict[str, int]:
        return dict(self.listing)

    def download(self, uri: S3Uri, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.part-{os.getpid()}")
        part.write_bytes(b"o" * self.listing[uri.key])
        os.replace(part, path)


def store(listing: dict[str, int]) -> ObjectStore:
    return ListedStore(listing)  # type: ignore[return-value]  # the two calls mirror makes


def hostile_keys(outside: Path) -> list[str]:
    keys = {"data/" + "/".join(parts) for n in range(1, 5) for parts in itertools.product(SEGMENTS, repeat=n)}
    keys |= {f"data/{'../' * up}{where}" for up in range(1, 5) for where in ("out/adapter", "x", "mnt/pvc/y")}
    keys |= {f"data/{outside}/planted", f"data//{outside.as_posix().lstrip('/')}/planted", "data/a/../../b"}
    return sorted(keys)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_no_listed_key_writes_outside_the_mirror(tmp_path: Path) -> None:
    mirror_root = tmp_path / "a" / "mirror"
    uri = S3Uri("bucket", "data")
    target = mirror_root / "bucket" / "data"
    keys = hostile_keys(tmp_path / "planted")
    outside_writes: list[str] = []
    refused = admitted = 0
    for key in keys:
        before = files_under(tmp_path)
        try:
            listing = {"data/ok.json": 2, key: 3}
            s3_inputs.mirror(store(listing), uri, listing, target, mirror_root)
        except s3_inputs.UnsafeObjectKey as exc:
            assert repr(key) in str(exc) and "outside" in str(exc)
            assert files_under(tmp_path) == before, f"{key!r} was refused after a write"
            refused += 1
        else:
            admitted += 1
        written = files_under(tmp_path) - before
        stamps = mirror_root / s3_inputs.STAMPS
        outside_writes += [
            f"{key!r} -> {p}" for p in written if not (p.is_relative_to(target) or p.is_relative_to(stamps))
        ]
        for path in files_under(tmp_path):  # the next key starts from an empty folder
            path.unlink()
    print(f"{len(keys)} hostile keys: {refused} refused, {admitted} copied inside the mirror, "
          f"{len(outside_writes)} writes outside it")  # fmt: skip
    assert outside_writes == []
    assert refused > 1000 and admitted > 0


def test_an_escaping_key_fails_the_whole_input_before_any_download(tmp_path: Path) -> None:
    uri = S3Uri("bucket", "data")
    target = tmp_path / "mirror" / "bucket" / "data"
    listing = {"data/a.json": 1, "data/../../../outside": 1, "data/z.json": 1}
    with pytest.raises(s3_inputs.UnsafeObjectKey, match=r"'data/\.\./\.\./\.\./outside'"):
        s3_inputs.mirror(store(listing), uri, listing, target, tmp_path / "mirror")
    assert files_under(tmp_path) == set()
