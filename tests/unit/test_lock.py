"""One lock for every environment: the test venv runs exactly uv.lock, and a disagreeing
pyproject.toml or a stale export of the lock fails the check that CI runs first.

Why: four environments once resolved their own versions from open floors (the tests, the GPU run
and the trainer image each ran another torch), and a silent upgrade broke CI. The images tier
compares the built images with the same export (tests/images/test_images.py).
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import REPO_ROOT
from tests.support.locked import differences, locked_pins, pins_of_export

UV = Path(sys.prefix) / "bin" / "uv"


def test_the_test_venv_runs_exactly_the_lock() -> None:
    # What scripts/bootstrap.sh syncs into the venv: the trainer extra and the dev group.
    exported = subprocess.run(
        [str(UV), "export", "--frozen", "--no-emit-project", "--no-header", "--quiet", "--extra", "trainer",
         "--group", "dev"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    locked = pins_of_export(exported, platform.python_version())
    installed = {dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions()}
    # pip is the venv's own, seeded by `python -m venv` before uv syncs the lock into it.
    wrong = differences(locked, installed, extra_ok={"finetune-operator", "pip"}, missing_ok=set())
    assert not wrong, "the venv differs from uv.lock (run bash scripts/bootstrap.sh):\n" + "\n".join(wrong)


def test_the_image_exports_pin_the_locked_torch_for_this_python() -> None:
    trainer = locked_pins("trainer", platform.python_version())
    assert trainer["torch"] == importlib.metadata.version("torch")
    assert "torch" not in locked_pins("operator", platform.python_version())


def _project_copy(tmp_path: Path) -> Path:
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy2(REPO_ROOT / name, tmp_path / name)
    shutil.copytree(REPO_ROOT / "requirements", tmp_path / "requirements")
    (tmp_path / "scripts").mkdir()
    shutil.copy2(REPO_ROOT / "scripts" / "lock.sh", tmp_path / "scripts" / "lock.sh")
    return tmp_path


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/lock.sh", "--check"],
        cwd=root, env={"PATH": "/usr/bin:/bin", "UV": str(UV), "HOME": str(root)},
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_the_committed_lock_and_exports_agree() -> None:
    result = _check(REPO_ROOT)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("path", "old", "new", "stale"),
    [
        ("pyproject.toml", '"kopf>=1.37"', '"kopf>=1.38"', "uv.lock"),
        ("requirements/trainer-image.txt", "\ntorch==", "\ntorch==0", "requirements/trainer-image.txt"),
        ("requirements/operator-image.txt", "\nkopf==", "\nkopf==0", "requirements/operator-image.txt"),
    ],
    ids=["a requirement changed without re-locking", "a hand-edited trainer pin", "a hand-edited operator pin"],
)
def test_the_check_names_what_disagrees(tmp_path: Path, path: str, old: str, new: str, stale: str) -> None:
    root = _project_copy(tmp_path)
    text = (root / path).read_text()
    assert old in text, f"{path} no longer contains {old!r}: update this test"
    (root / path).write_text(text.replace(old, new, 1))
    result = _check(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"out of date: {stale}" in result.stderr
