"""Each image's dependency stage is keyed by exactly its inputs (scripts/build-images.sh).

Why a test: the key decides whether a build reuses the dependency image kept in buildah's store
(the trainer's is ~8 GB) or builds it again (7-15 minutes for the trainer). A key that misses
an input ships dependencies that no longer match the lock or the Dockerfile; a key that
hashes too much (the source, a linter setting, the source stage) reinstalls torch on every run.
Fast: it hashes, it builds nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.factories import REPO_ROOT

COPIED = [
    "scripts/build-images.sh",
    "pyproject.toml",
    "requirements",
    "Dockerfile",
    "operator/finetune_operator/__init__.py",
    "trainer_image/Dockerfile",
    "trainer_image/imagebuild",
    "trainer_image/finetune_trainer",
]


def _checkout(tmp_path: Path) -> Path:
    for relative in COPIED:
        source, target = REPO_ROOT / relative, tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


def _key(root: Path, image: str = "trainer", **env: str) -> subprocess.CompletedProcess[str]:
    # The script reads pyproject.toml with python3 >= 3.11: this interpreter comes first on PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(root / "scripts/build-images.sh"), "--print-deps-key", image],
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line)


Edit = Callable[[Path], None]

UNCHANGED: dict[str, Edit] = {
    "a source file": lambda root: _append(root / "trainer_image/finetune_trainer/rank/loop.py", "\n# touched\n"),
    "a pyproject setting that is no requirement": lambda root: _edit(
        root / "pyproject.toml", "line-length = 120", "line-length = 121"
    ),
    # The images install the lock's export; a pyproject.toml that disagrees with the lock fails
    # scripts/lock.sh --check (and bootstrap's uv sync --locked) instead.
    "a requirement in pyproject.toml alone": lambda root: _edit(
        root / "pyproject.toml", '"kopf>=1.37"', '"kopf>=1.38"'
    ),
    "the trainer stage of the Dockerfile": lambda root: _edit(
        root / "trainer_image/Dockerfile", "PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0"
    ),
    "the image checks": lambda root: _append(root / "trainer_image/imagebuild/check_image.py", "\n# touched\n"),
}

CHANGED: dict[str, Edit] = {
    "a locked trainer requirement": lambda root: _edit(
        root / "requirements/trainer-image.txt", "\ndeepspeed==", "\ndeepspeed==0"
    ),
    "a locked core requirement": lambda root: _edit(root / "requirements/trainer-image.txt", "\nkopf==", "\nkopf==0"),
    "the locked build backend": lambda root: _edit(
        root / "requirements/trainer-image.txt", "\nsetuptools==", "\nsetuptools==0"
    ),
    "the deps stage of the Dockerfile": lambda root: _edit(
        root / "trainer_image/Dockerfile", "libgomp1 libibverbs1", "libgomp1 libnuma1 libibverbs1"
    ),
    "the op build helper": lambda root: _append(root / "trainer_image/imagebuild/deps/deepspeed-ops.sh", "\n# x\n"),
    "the compiler wrapper": lambda root: _append(root / "trainer_image/imagebuild/deps/portable-cc", "\n# x\n"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each image's key for the repository as it is."""
    root = _checkout(tmp_path_factory.mktemp("pristine"))
    keys = {image: _key(root, image) for image in ("operator", "trainer")}
    for result in keys.values():
        assert result.returncode == 0, result.stderr
        assert re.fullmatch(r"[0-9a-f]{16}\n", result.stdout), result.stdout
    return {image: result.stdout for image, result in keys.items()}


def _key_after(tmp_path: Path, edit: Edit, image: str = "trainer") -> str:
    root = _checkout(tmp_path)
    edit(root)
    result = _key(root, image)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("edit", list(UNCHANGED.values()), ids=list(UNCHANGED))
def test_key_ignores_what_the_dependency_stage_does_not_read(
    tmp_path: Path, edit: Edit, pristine: dict[str, str]
) -> None:
    assert _key_after(tmp_path, edit) == pristine["trainer"]


@pytest.mark.parametrize("edit", list(CHANGED.values()), ids=list(CHANGED))
def test_key_changes_with_each_input_of_the_dependency_stage(
    tmp_path: Path, edit: Edit, pristine: dict[str, str]
) -> None:
    assert _key_after(tmp_path, edit) != pristine["trainer"]


def test_a_dockerfile_without_the_trainer_stage_is_refused(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    _edit(root / "trainer_image/Dockerfile", "FROM deps AS trainer", "FROM deps AS final")
    result = _key(root)
    assert result.returncode != 0
    assert "has no line 'FROM deps AS trainer'" in result.stderr


OPERATOR_UNCHANGED: dict[str, Edit] = {
    "an operator source file": lambda root: _append(root / "operator/finetune_operator/__init__.py", "\n# x\n"),
    "a locked trainer requirement": CHANGED["a locked trainer requirement"],
    "the op build helper": CHANGED["the op build helper"],
    "the trainer's Dockerfile": CHANGED["the deps stage of the Dockerfile"],
    "the build stage of the operator's Dockerfile": lambda root: _edit(
        root / "Dockerfile", "kubernetes/aio; \\", "kubernetes/aio /tmp/x; \\"
    ),
}
OPERATOR_CHANGED: dict[str, Edit] = {
    "a locked core requirement": lambda root: _edit(root / "requirements/operator-image.txt", "\nkopf==", "\nkopf==0"),
    "the deps stage of the operator's Dockerfile": lambda root: _edit(
        root / "Dockerfile",
        "--disable-pip-version-check --no-deps",
        "--disable-pip-version-check --no-deps --no-compile",
    ),
}


@pytest.mark.parametrize(
    ("edit", "changes"),
    [*((edit, False) for edit in OPERATOR_UNCHANGED.values()), *((edit, True) for edit in OPERATOR_CHANGED.values())],
    ids=[
        *(f"unchanged by {name}" for name in OPERATOR_UNCHANGED),
        *(f"changed by {name}" for name in OPERATOR_CHANGED),
    ],
)
def test_operator_key_follows_only_its_own_inputs(
    tmp_path: Path, edit: Edit, changes: bool, pristine: dict[str, str]
) -> None:
    assert (_key_after(tmp_path, edit, "operator") != pristine["operator"]) is changes
