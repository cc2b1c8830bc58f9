"""A virtual environment of its own for a server the tests start, installed from a group of uv.lock.

Why: some servers cannot share the project's venv (MLflow's server pins python-dateutil below what
the Kubernetes client needs; vLLM's CPU build brings its own torch and transformers), yet their
versions come from the one lock like everything else: a dependency group of uv.lock, in a fork of
its own, exported and installed with hashes. The venv is made once per export under the cache
(`~/.cache/finetune-operator/<name>/<hash of the export>`), outside the work tree, while holding a
file lock, so parallel test workers neither race nor install twice; uv's cache keeps a rebuild
cheap.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import time
from pathlib import Path

from finetune_localcluster.binaries import REPO_ROOT, cache_dir

INSTALL_TIMEOUT_S = 1800


def locked_requirements(group: str) -> str:
    """The dependency group `group` of uv.lock, exported in pip's format with hashes."""
    return subprocess.run(
        [uv(), "export", "--frozen", "--only-group", group, "--no-emit-project", "--no-header", "--quiet"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout


def uv() -> str:
    """The project venv's uv (locked in the dev group), else one on PATH."""
    beside = Path(sys.prefix) / "bin" / "uv"
    return str(beside) if beside.exists() else "uv"


def group_venv(group: str, name: str) -> Path:
    """The virtual environment holding the locked `group`, created on first use under `name`."""
    requirements = locked_requirements(group)
    root = cache_dir() / name / hashlib.sha256(requirements.encode()).hexdigest()[:16]
    venv = root / "venv"
    ready = root / "ready"
    if ready.exists():
        return venv
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be installing: wait for it
        if ready.exists():
            return venv
        started = time.monotonic()
        print(f"finetune_localcluster: installing the lock's {group} group into {venv} (once)", file=sys.stderr)
        (root / "requirements.txt").write_text(requirements)
        subprocess.run([base_python(), "-m", "venv", "--clear", "--without-pip", str(venv)], check=True, timeout=300)
        subprocess.run(
            # --no-config: the project's [tool.uv] settings are for its own venv, not this one.
            [uv(), "pip", "install", "--quiet", "--no-config", "--python", str(venv / "bin" / "python"), "--no-deps",
             "--require-hashes", "--requirement", str(root / "requirements.txt")],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )  # fmt: skip
        ready.write_text(f"{time.monotonic() - started:.0f} s\n")
    return venv


def base_python() -> str:
    """The interpreter the project's venv was made from (a venv inside a venv inherits nothing)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base) if base.exists() else sys.executable
