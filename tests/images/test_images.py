"""Both images, built for real by scripts/build-images.sh (buildah, chroot isolation, debootstrap base).

Why a test: a Dockerfile that nobody builds rots (a dependency that needs a compiler, a user
that cannot write its home). The script itself runs `ftjob --help` and an import check inside
each image as its non-root user, and for the trainer trainer_image/imagebuild/check_image.py
(DeepSpeed's cpu_adam and async_io prebuilt and loaded without a compiler, libibverbs and its
providers, NCCL), and fails on any problem; this test runs it, asserts that every check ran,
and keeps the printed sizes honest. It also disassembles the prebuilt ops on this machine: an
AVX-512 instruction in them would kill a rank with SIGILL on GPU hosts without AVX-512.

Slow: the first run debootstraps Debian (~2 min). The trainer's dependency image (torch with
its CUDA libraries, ~8 GB, 7-15 min) is kept in buildah's store under a hash of its inputs, so
later runs build only the source layer (seconds) until the locked requirements
(requirements/<image>-image.txt, exported from uv.lock), the Dockerfile's deps stage or
trainer_image/imagebuild/deps/ change; the output says which. Each image's installed packages
are compared with the lock: the tests and the images run the same versions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.factories import REPO_ROOT
from tests.support.locked import differences, locked_pins

SCRIPT = REPO_ROOT / "scripts" / "build-images.sh"
# Upper bounds that catch an accident (torch in the operator image, a forgotten cache) without
# failing on the ordinary drift of dependency sizes.
MAX_BYTES = {"operator": 400e6, "trainer": 12e9}
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
TRAINER_CHECKS = [
    "no compiler and no nvcc on PATH",
    "ds_report lists cpu_adam and async_io as installed",
    "cpu_adam and async_io load prebuilt",
    "one DeepSpeedCPUAdam step updates the weights as Adam does",
    "async_io writes a tensor to a file and reads it back (libaio)",
    "libibverbs.so.1 loads",
    "verbs providers mlx5 (InfiniBand, RoCE) and efa are installed and load",
    "NCCL ",
]
# AVX-512 in AT&T disassembly: zmm registers, opmask registers k1-k7, ymm/xmm16-31 (EVEX only).
AVX512 = re.compile(r"%zmm\d|%k[1-7]\b|%[xy]mm(1[6-9]|2\d|3[01])\b")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.images,
    pytest.mark.skipif(
        shutil.which("buildah") is None and os.geteuid() != 0,
        reason="buildah is not installed and only root may apt-get it (apt-get install buildah debootstrap)",
    ),
]


@dataclass(frozen=True)
class Build:
    image: str
    result: subprocess.CompletedProcess[str]
    summary: str


def _size_bytes(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)\s*([kKMG]?B)", text.strip())
    assert match, f"unreadable size {text!r}"
    return float(match.group(1)) * UNITS[match.group(2)]


def _build(name: str, tmp_path: Path) -> Build:
    summary = tmp_path / "summary.txt"
    env = {**os.environ, "FTJOB_SUMMARY_FILE": str(summary), "FTJOB_IMAGE_TAG": "test"}
    result = subprocess.run(
        ["bash", str(SCRIPT), name], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
    )
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    assert "imports ok" in result.stdout, output
    return Build(f"localhost/finetune-{name}:test", result, summary.read_text().strip())


def _remove(image: str) -> None:
    # Nothing else uses the test tag. The trainer's dependency image stays: it is the cache.
    subprocess.run(["buildah", "rmi", "--force", image], capture_output=True, check=False)


def _image_bytes(build: Build, name: str) -> float:
    """The image's size from the build's summary, which must also say how its dependency image came
    (reused, or built) and that the source layer was built on it; a missing line fails the test."""
    print(build.summary)
    match = re.search(r"size (.+?)\s+build\s+(\d+) s", build.summary)
    assert match, build.summary
    deps = re.search(r"deps (reused|built in (\d+) s)", build.summary)
    assert deps, f"the summary does not say whether the dependency image was reused or built: {build.summary}"
    source = re.search(rf"finetune-{name}:test: source layer built in (\d+) s", build.result.stdout)
    assert source, build.result.stdout[-4000:]
    print(f"{name}: dependency image {deps.group(1)}; source layer {source.group(1)} s")
    return _size_bytes(match.group(1))


def _installed(build: Build) -> tuple[str, dict[str, str]]:
    """The image's Python version and every distribution installed in it, name -> version."""
    container = subprocess.run(
        ["buildah", "from", "--quiet", build.image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        listing = subprocess.run(
            ["buildah", "run", "--isolation", "chroot", container, "--", "python3", "-c",
             "import importlib.metadata as m, json, platform; print(json.dumps([platform.python_version(), "
             "{d.metadata['Name']: d.version for d in m.distributions()}]))"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    python, installed = json.loads(listing.strip().splitlines()[-1])
    return python, installed


@pytest.fixture(scope="module")
def operator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    try:
        yield _build("operator", tmp_path_factory.mktemp("operator"))
    finally:
        _remove("localhost/finetune-operator:test")


@pytest.mark.timeout(1200)
def test_operator_image_builds_on_a_kept_or_new_dependency_image(operator: Build) -> None:
    assert _image_bytes(operator, "operator") < MAX_BYTES["operator"], operator.summary


@pytest.mark.timeout(1200)
def test_operator_image_installs_exactly_the_lock(operator: Build) -> None:
    python, installed = _installed(operator)
    # The build stage removes its installer and build backend from the venv that ships.
    wrong = differences(
        locked_pins("operator", python), installed, extra_ok={"finetune-operator"}, missing_ok={"setuptools", "wheel"}
    )
    assert not wrong, "the operator image differs from uv.lock:\n" + "\n".join(wrong)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    try:
        yield _build("trainer", tmp_path_factory.mktemp("trainer"))
    finally:
        _remove("localhost/finetune-trainer:test")


@pytest.mark.timeout(3600)
def test_trainer_image_builds_on_a_kept_or_new_dependency_image(trainer: Build) -> None:
    assert _image_bytes(trainer, "trainer") < MAX_BYTES["trainer"], trainer.summary


@pytest.mark.timeout(3600)
def test_trainer_image_installs_exactly_the_lock(trainer: Build) -> None:
    python, installed = _installed(trainer)
    locked = locked_pins("trainer", python)
    assert locked["torch"] == installed.get("torch"), "the trainer image must run the locked torch"
    wrong = differences(locked, installed, extra_ok={"finetune-operator"}, missing_ok=set())
    assert not wrong, "the trainer image differs from uv.lock:\n" + "\n".join(wrong)


@pytest.mark.timeout(3600)
def test_trainer_image_has_prebuilt_ops_and_rdma_libraries(trainer: Build) -> None:
    ran = [line for line in trainer.result.stdout.splitlines() if line.startswith("check ok: ")]
    print("\n".join(ran))
    missing = [check for check in TRAINER_CHECKS if not any(line.startswith(f"check ok: {check}") for line in ran)]
    assert not missing, f"checks that did not report: {missing}\n{trainer.result.stdout[-4000:]}"


@pytest.mark.timeout(3600)
def test_prebuilt_ops_have_no_avx512_instructions(trainer: Build, tmp_path: Path) -> None:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed to disassemble the prebuilt ops"
    container = subprocess.run(
        ["buildah", "from", "--quiet", trainer.image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        listing = subprocess.run(
            ["buildah", "run", "--isolation", "chroot", container, "--", "python3", "-c",
             "import deepspeed, glob, os; root = os.path.dirname(deepspeed.__file__); "
             "print('\\n'.join(sorted(glob.glob(root + '/ops/*/*_op*.so'))))"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        listing = [path for path in listing if path.endswith(".so")]  # not a log line's words
        names = {Path(path).name.split(".")[0] for path in listing}
        assert {"cpu_adam_op", "async_io_op", "pin_memory_op"} <= names, listing
        for path in listing:
            local = tmp_path / Path(path).name
            with local.open("wb") as out:
                cat = ["buildah", "run", "--isolation", "chroot", container, "--", "cat", path]
                subprocess.run(cat, stdout=out, check=True)
            disassembly = subprocess.run(
                [objdump, "-d", "--no-show-raw-insn", str(local)], capture_output=True, text=True, check=True
            ).stdout
            if "cpu_adam" in path:  # Adam's SIMD path under -D__AVX256__ uses FMA: a scalar build would not
                assert "vfmadd" in disassembly, f"{path}: no FMA instruction, the AVX2 path of CPU Adam was lost"
            hits = [line for line in disassembly.splitlines() if AVX512.search(line)]
            assert not hits, f"{path} has AVX-512 instructions, e.g. {hits[:3]}"
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
