"""Checkpoints, results and the completion marker of a job whose output is on `s3://`.

The ranks save a checkpoint exactly as on a claim (`saves.save`), into the pod's local
scratch folder (FTJOB_OUTPUT_DIR, an emptyDir the plan sizes). Then, collectively:

1. each pod's first rank uploads what its pod wrote to `<output>/checkpoints/step-N/`;
2. once every pod has uploaded, rank 0 writes `step-N/manifest.json` (every file and its size,
   and the trainer state): the **commit**. A folder without its manifest does not exist: resume
   ignores it and retention deletes it;
3. rank 0 applies `checkpointsToKeep` to the bucket (a manifest is deleted before its files, so
   a half-deleted checkpoint is never committed) and every pod frees its scratch.

An upload that fails is retried with backoff until the store's deadline; the ranks agree on
the outcome, so either the checkpoint is committed or every rank fails with `DataUnavailable`,
and the previous checkpoint stays committed and untouched.

On resume each pod's first rank downloads, of the newest committed checkpoint, only what its
own ranks read (`needed_files`): the trainable state and their RNG files (LoRA, QLoRA), or the
shared model states and their own ZeRO shards (full fine-tuning); all of it only when the shards
must be converted to another strategy, which each pod then does locally.

The tracking journal (`<output>/tracking/`) and TensorBoard's event files (`<output>/tensorboard/`)
live on the same scratch: rank 0 uploads them beside the checkpoints at each commit, and the
launcher once more when the run's tracking has finished (`upload_tracking`), so the bucket holds
them as a claim would. A failure there is logged and never fails training.

Deletions stay under `<output>/checkpoints/` (enforced by `ObjectStore.delete`): nothing else the
user keeps in the bucket is touched.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from finetune_operator.api.pod_contract import CheckpointFormat, CheckpointState
from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.storage_uri import is_s3
from finetune_operator.api.strategy import Strategy
from finetune_operator.api.tracking import TENSORBOARD_DIR, TRACKING_DIR
from finetune_trainer import faults, leader_work
from finetune_trainer.checkpoint import saves, universal
from finetune_trainer.checkpoint.portable import TRAINABLE_FILE
from finetune_trainer.storage.objstore import ObjectStore, S3Uri, StoreError, StoreNotFound, confined, store_for
from finetune_trainer.storage.paths import CHECKPOINTS, COMPLETION_MARKER

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_STEP_KEY = re.compile(r"^step-(\d+)/(.+)$")
_RNG_FILE = re.compile(r"^rng_state_rank(\d+)\.pt$")
_ZERO_SHARD = re.compile(r"(?:^|[/_])zero_pp_rank_(\d+)_")
TRACKING_FOLDERS = (TRACKING_DIR, TENSORBOARD_DIR)
"""The tracking journal's folder and TensorBoard's, under the output."""


class Collective(Protocol):
    rank: int

    def sum(self, values: list[float]) -> list[float]: ...

    def barrier(self) -> None: ...


@dataclass(frozen=True)
class Manifest:
    """What commits a checkpoint: its files (path in the folder -> bytes) and trainer state."""

    step: int
    files: dict[str, int]
    state: str
    """`trainer_state.json`'s text (a `CheckpointState`)."""

    def to_json(self) -> bytes:
        body = {"manifestVersion": MANIFEST_VERSION, "step": self.step, "files": self.files, "state": self.state}
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        body = json.loads(data)
        return cls(int(body["step"]), {str(k): int(v) for k, v in body["files"].items()}, str(body["state"]))

    @property
    def checkpoint_state(self) -> CheckpointState:
        return CheckpointState.from_file(self.state)


@dataclass(frozen=True)
class Scan:
    """The checkpoint folders under `<output>/checkpoints/`, from one listing."""

    committed: list[int]
    """Steps with a manifest, oldest first."""
    keys: dict[int, list[str]]
    """Every key of each step's folder (full keys), committed or not."""


def scan(listing: dict[str, int], checkpoints: S3Uri) -> Scan:
    keys: dict[int, list[str]] = {}
    committed = set()
    for key in listing:
        if not key.startswith(checkpoints.key + "/"):
            continue
        match = _STEP_KEY.match(key[len(checkpoints.key) + 1 :])
        if match is None:
            continue
        step = int(match.group(1))
        keys.setdefault(step, []).append(key)
        if match.group(2) == MANIFEST:
            committed.add(step)
    return Scan(sorted(committed), keys)


def garbage(found: Scan, keep: int) -> tuple[list[str], list[str]]:
    """(manifests, then other keys) to delete: uncommitted folders whole, and every committed
    checkpoint but the newest `keep` (its manifest first, so it is never half committed)."""
    dropped = set(found.committed[:-keep] if keep > 0 else found.committed)
    manifests: list[str] = []
    rest: list[str] = []
    for step, keys in found.keys.items():
        if step in found.committed and step not in dropped:
            continue
        for key in keys:
            (manifests if key.endswith("/" + MANIFEST) else rest).append(key)
    return sorted(manifests), sorted(rest)


def needed_files(files: Sequence[str], fmt: CheckpointFormat | None, ranks: range, whole: bool) -> list[str]:
    """The files of a checkpoint that the ranks `ranks` of one pod read on resume."""
    if whole:
        return sorted(files)
    wanted = []
    for name in files:
        rng = _RNG_FILE.match(name)
        shard = _ZERO_SHARD.search(name)
        if rng is not None:
            keep = int(rng.group(1)) in ranks
        elif fmt == CheckpointFormat.TRAINABLE:
            keep = name in (TRAINABLE_FILE, saves.STATE_FILE)
        else:
            keep = shard is None or int(shard.group(1)) in ranks
        if keep:
            wanted.append(name)
    return sorted(wanted)


class S3Output:
    """The collective side of a run whose output is on s3:// (one per rank)."""

    def __init__(
        self,
        store: ObjectStore,
        root: S3Uri,
        dist: Collective,
        *,
        local_rank: int,
        local_size: int,
        pods: int = 1,
        fault: Callable[[str, int], None] | None = None,
    ) -> None:
        self.store, self.root, self.dist = store, root, dist
        self.checkpoints = root.child(CHECKPOINTS)
        self._tracking_sent: dict[Path, tuple[int, int]] = {}
        self.leader = local_rank == 0
        self.pods = pods
        """Leaders (each pod's first rank): they upload and download while the others wait."""
        first = dist.rank - local_rank
        self.node_ranks = range(first, first + local_size)
        self._fault = fault or (lambda where, step: None)

    @classmethod
    def for_trainer(cls, spec: Any, out: Path, dist: Collective) -> S3Output | None:
        """None unless `spec.output.uri` is on s3://."""
        if not is_s3(spec.output.uri):
            return None

        def fault(where: str, step: int) -> None:
            faults.fault_point(where, step, once_in=out)

        return cls(
            store_for(spec.object_storage),
            S3Uri.parse(spec.output.uri),
            dist,
            local_rank=int(os.environ.get(PodEnv.LOCAL_RANK, "0")),
            local_size=int(os.environ.get(PodEnv.LOCAL_SIZE, "1")),
            pods=int(os.environ.get(PodEnv.CROSS_SIZE, "1")),
            fault=fault,
        )

    def _alone(self, work: Callable[[], str], *, leaders: bool, what: str) -> str:
        """Every pod's leader (`leaders`) or rank 0 runs `work` while the others wait outside the
        collective timeout (`leader_work`); returns this rank's error (a store or file error)."""
        error = ""

        def guarded() -> None:
            nonlocal error
            try:
                error = work()
            except (StoreError, OSError) as exc:
                error = str(exc)

        doer = self.leader if leaders else self.dist.rank == 0
        leader_work.run(guarded, doer=doer, doers=self.pods if leaders else 1, what=what)
        return error

    def _agree(self, error: str, what: str) -> None:
        """Collective: raise on every rank if any rank failed (its own message where it has one)."""
        if self.dist.sum([1.0 if error else 0.0])[0]:
            raise StoreError(f"{what}: {error or 'failed on another rank (see its log)'}")

    # ---- save ----------------------------------------------------------------------------
    def publish(self, ckpt_root: Path, step: int, keep: int) -> str:
        """Collective, right after `saves.save`: upload, commit, retain; returns the URI."""
        name = saves.step_dir_name(step)
        final, tmp = ckpt_root / name, ckpt_root / f"{saves.TMP_PREFIX}{name}"
        prefix = self.checkpoints.child(name)

        def upload() -> str:
            folder = final if final.is_dir() else tmp  # only rank 0's pod renames its folder
            for i, path in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
                self.store.upload(path, prefix.child(path.relative_to(folder).as_posix()))
                if i == 0:
                    self._fault("upload", step)
            return ""

        def commit() -> str:
            listing = self.store.list(prefix)
            files = {key[len(prefix.key) + 1 :]: size for key, size in listing.items() if not key.endswith("/")}
            manifest = Manifest(step, files, (final / saves.STATE_FILE).read_text())
            self.store.put_bytes(prefix.child(MANIFEST), manifest.to_json())
            self.retain(keep)
            # Rank 0's tracking files go with the commit, while the others wait outside the
            # collective timeout (a failure is logged, never raised).
            upload_tracking(self.store, self.root, ckpt_root.parent, self._tracking_sent)
            return ""

        error = self._alone(upload, leaders=True, what=f"uploading checkpoint {name}")
        self._agree(error, f"uploading checkpoint {name} ({self._intact()})")
        error = self._alone(commit, leaders=False, what=f"committing checkpoint {name}")
        self._agree(error, f"committing checkpoint {name} ({self._intact()})")
        if self.leader:  # committed: the scratch holds no checkpoint until the next save
            _empty(ckpt_root)
        return str(prefix)

    def _intact(self) -> str:
        return "the previous committed checkpoint is intact"

    def retain(self, keep: int) -> int:
        """Delete uncommitted folders and committed checkpoints beyond the newest `keep`."""
        found = scan(self.store.list(self.checkpoints), self.checkpoints)
        manifests, rest = garbage(found, keep)
        deleted = self.store.delete(manifests, within=self.checkpoints) if manifests else 0
        deleted += self.store.delete(rest, within=self.checkpoints) if rest else 0
        if deleted:
            log.info("deleted %d object(s) of old or uncommitted checkpoints under %s", deleted, self.checkpoints)
        return deleted

    # ---- resume --------------------------------------------------------------------------
    def newest(self) -> Manifest | None:
        found = scan(self.store.list(self.checkpoints), self.checkpoints)
        if not found.committed:
            return None
        step = found.committed[-1]
        return Manifest.from_json(
            self.store.get_bytes(self.checkpoints.child(f"{saves.step_dir_name(step)}/{MANIFEST}"))
        )

    def stage_newest(self, ckpt_root: Path, strategy: Strategy) -> int | None:
        """Collective, before the loop looks for a checkpoint: rank 0 deletes uncommitted
        folders; each pod's first rank replaces its local checkpoints with what its ranks need
        of the newest committed one. Returns its step (None: a fresh start)."""
        step = None

        def download() -> str:
            nonlocal step
            if self.dist.rank == 0:
                self.retain(keep=1_000_000)  # uncommitted folders only
            step = self._download_newest(ckpt_root, strategy)
            return ""

        error = self._alone(download, leaders=True, what="downloading the newest committed checkpoint")
        self._agree(error, "downloading the newest committed checkpoint")
        return step

    def _download_newest(self, ckpt_root: Path, strategy: Strategy) -> int | None:
        _empty(ckpt_root)  # anything local predates the bucket's state: never trusted
        manifest = self.newest()
        if manifest is None:
            return None
        state = manifest.checkpoint_state
        saved = state.strategy
        convert = (
            state.checkpoint_format == CheckpointFormat.DEEPSPEED
            and saved is not None
            and universal.needs_conversion(saved, strategy)
        )
        name = saves.step_dir_name(manifest.step)
        wanted = needed_files(list(manifest.files), state.checkpoint_format, self.node_ranks, whole=convert)
        staging = ckpt_root / f"{saves.TMP_PREFIX}{name}"
        local = {rel: confined(staging, rel) for rel in wanted}  # the manifest is the bucket's text
        outside = sorted(rel for rel, path in local.items() if path is None)
        if outside:
            raise StoreError(f"{self.checkpoints}/{name}/manifest.json names {outside[0]!r}, outside the checkpoint")
        for rel, path in local.items():
            assert path is not None
            self.store.download(self.checkpoints.child(f"{name}/{rel}"), path)
        (staging / saves.STATE_FILE).write_text(manifest.state)
        staging.rename(ckpt_root / name)
        log.warning(
            "downloaded %d of %d files of %s/%s for ranks %d-%d",
            len(wanted),
            len(manifest.files),
            self.checkpoints,
            name,
            self.node_ranks.start,
            self.node_ranks.stop - 1,
        )
        if convert and self.dist.rank != 0:  # rank 0 converts in `saves.load`; every pod needs a copy
            universal.convert(ckpt_root / name)
        return manifest.step

    # ---- results -------------------------------------------------------------------------
    def publish_results(self, out: Path, local: Sequence[Path]) -> dict[Path, str]:
        """Collective: rank 0 uploads the folders `local` (adapter, model, merged) and the train
        log; returns each folder's s3:// URI."""
        uris = {path: str(self.root.child(path.relative_to(out).as_posix())) for path in local}

        def upload() -> str:
            for path in local:
                for file in sorted(p for p in path.rglob("*") if p.is_file()):
                    self.store.upload(file, S3Uri.parse(uris[path]).child(file.relative_to(path).as_posix()))
            for extra in ("train_log.jsonl",):
                if (out / extra).is_file():
                    self.store.upload(out / extra, self.root.child(extra))
            return ""

        error = self._alone(upload, leaders=False, what="uploading the trained result")
        self._agree(error, "uploading the trained result")
        return uris


def upload_tracking(
    store: ObjectStore, root: S3Uri, out: Path, known: dict[Path, tuple[int, int]] | None = None
) -> int:
    """Copy the tracking journal and TensorBoard's event files from the scratch `out` to the
    output prefix `root`, each file whole; with `known` (file -> size and mtime when sent), only
    files new or changed since. Returns the files sent; a failure is logged, never raised: tracking
    never fails training."""
    known = {} if known is None else known
    sent = 0
    try:
        for folder in (out / name for name in TRACKING_FOLDERS):
            for path in sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []:
                stat = path.stat()
                if known.get(path) != (stat.st_size, stat.st_mtime_ns):
                    store.upload(path, root.child(path.relative_to(out).as_posix()))
                    known[path] = (stat.st_size, stat.st_mtime_ns)
                    sent += 1
    except (StoreError, OSError) as exc:
        log.warning("tracking files not copied to %s: %s", root, str(exc)[:300])
    return sent


def publish_tracking(spec: Any, out: Path) -> int:
    """`upload_tracking` for a job whose output is on s3:// (after its tracking finished); 0 otherwise."""
    if not is_s3(spec.output.uri):
        return 0
    return upload_tracking(store_for(spec.object_storage), S3Uri.parse(spec.output.uri), out)


def _empty(folder: Path) -> None:
    if folder.is_dir():
        for child in folder.iterdir():
            shutil.rmtree(child, ignore_errors=True)


def publish_completion(spec: Any, summary: dict[str, Any]) -> None:
    """Rank 0, last: the completion marker beside the result, for a pod started after the end."""
    if is_s3(spec.output.uri):
        store = store_for(spec.object_storage)
        store.put_bytes(S3Uri.parse(spec.output.uri).child(COMPLETION_MARKER), json.dumps(summary).encode())


def completed(spec: Any) -> bytes | None:
    """The completion marker's content when the job's s3:// output holds one."""
    if not is_s3(spec.output.uri):
        return None
    try:
        return store_for(spec.object_storage).get_bytes(S3Uri.parse(spec.output.uri).child(COMPLETION_MARKER))
    except StoreNotFound:
        return None
