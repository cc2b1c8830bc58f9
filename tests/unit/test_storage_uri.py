"""One storage abstraction: a URI is parsed once (`api/storage_uri.py`), and nothing else looks at its prefix.

Each form the API accepts (its pydantic models check the grammar declared beside the parser, and
name the field in a refusal) splits into the parts the renderers and the trainer use. The scheme
prefix checks that were
spread over the operator and the trainer must not come back, and an `s3://` input mirrored by
`s3_inputs` must be where `paths.resolve_uri` sends the ranks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.storage_uri import Scheme, StorageUri
from finetune_trainer.pod import s3_inputs
from finetune_trainer.storage import paths
from finetune_trainer.storage.objstore import Connection, ObjectStore, S3Uri
from tests.factories import REPO_ROOT, job_document, make_job
from tests.support.job_menu import parse_job, set_field

S3_ACCESS = {"credentials": {"secretName": "s3"}}

PARTS: list[tuple[str, str, dict[str, Any]]] = [
    ("pvc://claim/a/b.jsonl", "dataset.uri", {"scheme": Scheme.CLAIM, "claim": "claim", "path": "a/b.jsonl"}),
    ("pvc://claim", "output.uri", {"scheme": Scheme.CLAIM, "claim": "claim", "path": ""}),
    ("pvc://claim/dir/", "model.uri", {"scheme": Scheme.CLAIM, "claim": "claim", "path": "dir/"}),
    ("s3://bucket/key.jsonl", "dataset.uri", {"scheme": Scheme.S3, "bucket": "bucket", "key": "key.jsonl"}),
    ("s3://runs/job/", "output.uri", {"scheme": Scheme.S3, "bucket": "runs", "key": "job/"}),
    ("meta-llama/Llama-3.1-8B", "model.uri", {"scheme": Scheme.HUB, "repo": "meta-llama/Llama-3.1-8B"}),
    ("hf://Qwen/Qwen3-8B@main", "model.uri", {"scheme": Scheme.HUB, "repo": "Qwen/Qwen3-8B", "revision": "main"}),
    ("org/model@a1b2/c", "model.uri", {"scheme": Scheme.HUB, "repo": "org/model", "revision": "a1b2/c"}),
    ("hf://org/ds", "dataset.uri", {"scheme": Scheme.HUB, "repo": "org/ds", "revision": None}),
    ("builtin://tiny-llama", "model.uri", {"scheme": Scheme.BUILTIN, "name": "tiny-llama"}),
    ("builtin://secret-code", "dataset.uri", {"scheme": Scheme.BUILTIN, "name": "secret-code"}),
    ("/models/x", "model.uri", {"scheme": Scheme.PATH, "path": "/models/x"}),
    ("file:///models/x", "dataset.uri", {"scheme": Scheme.PATH, "path": "/models/x"}),
    ("/out", "output.uri", {"scheme": Scheme.PATH, "path": "/out"}),
]


@pytest.mark.parametrize(("uri", "field", "parts"), PARTS)
def test_each_accepted_form_parses_into_its_parts(uri: str, field: str, parts: dict[str, Any]) -> None:
    document = job_document(objectStorage=S3_ACCESS)
    set_field(document["spec"], field, uri)
    _, errors = parse_job(document)
    assert not [line for line in errors if line.startswith(f"spec.{field}:")], errors  # the API accepts it
    parsed = StorageUri.of(uri)
    assert {name: getattr(parsed, name) for name in parts} == parts
    assert parsed.text == uri


def test_location_drops_only_the_scheme() -> None:
    assert StorageUri.of("hf://org/m@v1").location == "org/m@v1"
    assert StorageUri.of("org/m").location == "org/m"
    assert StorageUri.of("file:///x/y").location == "/x/y"
    assert StorageUri.of("/x/y").location == "/x/y"
    assert StorageUri.of("s3://b/k/").location == "b/k/"


SCHEME_CHECK = re.compile(
    r"""(startswith|removeprefix|removesuffix)\(\s*["'](s3|pvc|builtin|file|hf)://|"""
    r"""len\(\s*["'](s3|pvc|builtin|file|hf)://|(LOCAL|BUILTIN)_PREFIX|S3_SCHEME"""
)
HOME = Path("operator/finetune_operator/api/storage_uri.py")


MOUNT_ROOT = re.compile(r"""["'](/mnt/pvc|/var/cache/ftjob(/s3)?)["']""")
"""A mount root spelled out as a string of its own (docstrings that mention a path inside one are fine)."""


def _lines_matching(pattern: re.Pattern[str], skip: set[Path]) -> list[str]:
    found = []
    for root in ("operator", "trainer_image"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT)
            if relative in skip:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_scheme_prefix_check_is_left_outside_the_storage_uri() -> None:
    assert _lines_matching(SCHEME_CHECK, {HOME}) == []


def test_the_mount_roots_are_declared_once() -> None:
    assert _lines_matching(MOUNT_ROOT, {HOME}) == []


class ListedStore:
    """What `s3_inputs.fetch` asks of a store (list, download), over a listing given by the test."""

    def __init__(self, listing: dict[str, bytes]) -> None:
        self.objects = listing
        self.conn = Connection(endpoint="http://127.0.0.1:9")

    def list(self, prefix: S3Uri) -> dict[str, int]:
        return {key: len(body) for key, body in self.objects.items() if key.startswith(prefix.key)}

    def download(self, uri: S3Uri, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.objects[uri.key])


def test_a_mirrored_input_is_where_the_ranks_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PodEnv.FTJOB_S3_MIRROR, str(tmp_path / "mirror"))
    job = make_job(
        model={"uri": "s3://models/base/", "architecture": "meta-llama/Llama-3.1-8B", "adapter": "s3://runs/sft/"},
        dataset={"uri": "s3://data/train.jsonl"},
        objectStorage=S3_ACCESS,
    )
    objects = {
        "base/config.json": b"{}",
        "base/w/model.safetensors": b"w" * 7,
        "train.jsonl": b'{"a": 1}\n',
        "sft/adapter_config.json": b'{"r": 8}',
    }
    store: ObjectStore = ListedStore(objects)  # type: ignore[assignment]  # the two calls fetch makes
    written = s3_inputs.fetch(job.spec, node_rank=1, store=store)
    model_dir = Path(str(paths.resolve_uri(job.spec.model.uri)))
    data_file = Path(str(paths.resolve_uri(job.spec.dataset.uri)))
    adapter_dir = Path(str(paths.resolve_uri(str(job.spec.model.adapter))))
    assert written == [model_dir, adapter_dir, data_file]
    assert (adapter_dir / "adapter_config.json").read_bytes() == b'{"r": 8}'  # where start_adapter reads it
    assert (model_dir / "config.json").read_bytes() == b"{}"
    assert (model_dir / "w" / "model.safetensors").read_bytes() == b"w" * 7
    assert data_file.read_bytes() == b'{"a": 1}\n'
    assert os.path.commonpath([model_dir, data_file]) == str(tmp_path / "mirror")


@pytest.mark.parametrize(
    ("output_uri", "out", "expected"),
    [
        # the operator's layout: the output folder is the claim's mount (FTJOB_OUTPUT_DIR = /mnt/pvc/<claim>/<path>)
        ("pvc://ftjob-output/tiny-cpu", "ftjob-output/tiny-cpu", "pvc://ftjob-output/tiny-cpu/adapter"),
        ("pvc://ftjob-output/runs/a/", "ftjob-output/runs/a", "pvc://ftjob-output/runs/a/adapter"),
        ("pvc://whole-claim", "whole-claim", "pvc://whole-claim/adapter"),
        # `ftjob run --output DIR` of a pvc:// job writes elsewhere: the files are on this machine
        ("pvc://ftjob-output/tiny-cpu", "local/run", "file://{root}/local/run/adapter"),
        ("/out/job", "local/out", "file://{root}/local/out/adapter"),
    ],
)
def test_a_result_is_named_where_it_can_be_read_from_outside_the_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output_uri: str, out: str, expected: str
) -> None:
    monkeypatch.setenv(PodEnv.FTJOB_PVC_ROOT, str(tmp_path / "mnt"))
    folder = (tmp_path / "mnt" / out) if not out.startswith("local") else (tmp_path / out)
    uri = paths.result_uri(output_uri, folder, folder / "adapter")
    assert uri == expected.format(root=tmp_path.resolve())
    assert not uri.startswith(str(tmp_path)), "never a bare path inside the pod"


def test_a_result_uri_is_found_again_on_the_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracking uploads the adapter from where `result_uri` named it (an s3:// result is not on the pod)."""
    monkeypatch.setenv(PodEnv.FTJOB_PVC_ROOT, str(tmp_path / "mnt"))
    out = tmp_path / "mnt" / "runs" / "job"
    for folder in (out / "adapter", tmp_path / "local" / "adapter"):
        output_uri = "pvc://runs/job" if folder.parent == out else "/out"
        uri = paths.result_uri(output_uri, folder.parent, folder)
        assert paths.result_folder(uri) == folder.resolve(), uri
    assert paths.result_folder("s3://bkt/runs/job/adapter") is None
