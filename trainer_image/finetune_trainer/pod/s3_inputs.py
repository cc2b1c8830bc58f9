"""Models and data on `s3://`, mirrored once per pod before the ranks start.

`ftjob train` calls `fetch` right after the hub prefetch: every `s3://` input of the spec
(model, tokenizer, dataset, validation set) is copied to `paths.s3_mirror()/bucket/key`
(the pod's model cache volume, `paths.mirror_folder`), where `paths.resolve_uri` sends the ranks. Eight ranks of a
pod thus read one local copy, and a cache on a claim survives gang restarts.

A bucket is not trusted to name local files: an object key is a string, and a shared or hostile
bucket may list `data/../../../mnt/pvc/out/adapter` or `data//etc/x`. Every key is mapped to its
local file, resolved, and checked to stay under the copy's folder before the first byte is
written; one key that would not is `UnsafeObjectKey`, naming it, and nothing is downloaded.

Nothing partial is ever read as complete: each file is downloaded under a temporary name
and renamed when whole (see `ObjectStore.download`), and a stamp listing every key and size
is written last. A later start that finds the stamp equal to the bucket's listing downloads
nothing; otherwise it fetches only the files whose local size differs.

While it downloads, node 0 serves the same two gauges as the hub download (see `prefetch`),
so `kubectl get ftj` shows the progress.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.storage_uri import StorageUri
from finetune_trainer.metrics.exporter import metrics_port
from finetune_trainer.pod.prefetch import download_progress
from finetune_trainer.storage.objstore import ObjectStore, S3Uri, StoreError, StoreNotFound, confined, store_for
from finetune_trainer.storage.paths import mirror_folder, s3_mirror

log = logging.getLogger(__name__)
STAMPS = ".ftjob-stamps"


def input_uris(spec: FineTuneJobSpec) -> list[str]:
    """The spec's s3:// inputs (the output is written, never mirrored), each once."""
    found = {field: uri for field, uri in spec.s3_uris.items() if field != "spec.output.uri"}
    return list(dict.fromkeys(found.values()))


def _stamp_path(mirror_root: Path, uri: S3Uri) -> Path:
    return mirror_root / STAMPS / uri.bucket / f"{uri.key}.json"


class UnsafeObjectKey(StoreError):
    """A listed key would land outside the local copy's folder (or is no file name at all)."""


def _local_file(uri: S3Uri, key: str, target: Path) -> Path:
    """Where object `key` (at or under `uri`) lands, `target` being `uri`'s local path: always
    `target` itself or a file under it."""
    if key == uri.key:
        return target
    local = confined(target, key[len(uri.key) + 1 :])
    if local is not None:
        return local
    raise UnsafeObjectKey(
        f"refusing object key {key!r} of {uri}: it would land outside the local copy {target} (a key with a "
        "'..', '.' or empty segment or a NUL byte is not copied); nothing was downloaded"
    )


def check_keys(listing: dict[str, int], uri: S3Uri, target: Path) -> None:
    """Raise `UnsafeObjectKey` if any listed key would land outside `target`."""
    for key in listing:
        if not key.endswith("/"):
            _local_file(uri, key, target)


def plan_downloads(listing: dict[str, int], uri: S3Uri, target: Path) -> list[tuple[str, Path]]:
    """(key, local file) for each listed object missing locally or of another size; folder
    markers (keys ending in '/') are skipped. Every key is checked before any is downloaded."""
    todo = []
    for key, size in sorted(listing.items()):
        if key.endswith("/"):
            continue
        local = _local_file(uri, key, target)
        try:
            same = local.stat().st_size == size
        except OSError:
            same = False
        if not same:
            todo.append((key, local))
    return todo


def listed(store: ObjectStore, uri: S3Uri) -> dict[str, int]:
    listing = store.list(uri)
    if not listing:
        raise StoreNotFound(f"{uri}: no object at or under this URI at {store.conn.where}")
    return listing


def mirror(store: ObjectStore, uri: S3Uri, listing: dict[str, int], target: Path, mirror_root: Path) -> int:
    """Make `target` a complete copy of `uri` (an object or a prefix, as `listing` says);
    returns the bytes fetched."""
    stamp = _stamp_path(mirror_root, uri)
    wanted = json.dumps(listing, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted and not plan_downloads(listing, uri, target):
        log.warning("%s is already in the cache %s", uri, target)
        return 0
    stamp.unlink(missing_ok=True)
    fetched = 0
    for key, local in plan_downloads(listing, uri, target):
        store.download(S3Uri(uri.bucket, key), local)
        fetched += listing[key]
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_name(stamp.name + f".part-{os.getpid()}")
    tmp.write_text(wanted)
    os.replace(tmp, stamp)
    return fetched


def fetch(spec: FineTuneJobSpec, node_rank: int = 0, store: ObjectStore | None = None) -> list[Path]:
    """Mirror every s3:// input of the job; returns the local copies (none without s3:// inputs)."""
    uris = input_uris(spec)
    if not uris:
        return []
    store = store or store_for(spec.object_storage)
    mirror_root = s3_mirror()
    targets: list[tuple[S3Uri, dict[str, int], Path]] = []
    for text in uris:
        parsed = S3Uri.parse(text)
        targets.append((parsed, listed(store, parsed), mirror_folder(StorageUri.of(text), mirror_root)))
    for uri, listing, target in targets:  # every key of every input, before the first download
        check_keys(listing, uri, target)
    total = sum(sum(listing.values()) for _, listing, _ in targets)
    port = metrics_port(0) if node_rank == 0 else None
    address = os.environ.get(PodEnv.FTJOB_POD_IP, "127.0.0.1")
    log.warning("copying %s from %s into %s (once per pod)", ", ".join(uris), store.conn.where, mirror_root)
    with download_progress(total, mirror_root, port=port, address=address):
        for uri, listing, target in targets:
            mirror(store, uri, listing, target, mirror_root)
    return [target for _, _, target in targets]
