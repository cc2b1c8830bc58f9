"""The versions the one lock (uv.lock) pins for an image, read from its export in requirements/.

Why: the images tier proves that the bytes a user pulls are the locked ones. scripts/lock.sh
exports uv.lock to requirements/<image>-image.txt (pip's format, with hashes and environment
markers); this reads the pins whose markers hold for a given Python, so a test can compare them
with what is installed inside a built image.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

from tests.factories import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;\s*(.*?))?\s*\\?$")


def locked_pins(image: str, python_full_version: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """Canonical name -> version of every pin of the image's export that applies on Linux with this Python."""
    pins = pins_of_export((root / "requirements" / f"{image}-image.txt").read_text(), python_full_version)
    assert pins, f"requirements/{image}-image.txt has no pins: run bash scripts/lock.sh"
    return pins


def pins_of_export(exported: str, python_full_version: str) -> dict[str, str]:
    """Canonical name -> version of each pin of a `uv export` text whose markers hold for this Python on Linux."""
    environment = {
        "python_full_version": python_full_version,
        "python_version": ".".join(python_full_version.split(".")[:2]),
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
    }
    pins: dict[str, str] = {}
    for line in exported.splitlines():
        match = PIN.match(line)
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker and not Marker(marker).evaluate(environment):
            continue
        pins[canonicalize_name(name)] = version
    return pins


def differences(
    locked: dict[str, str], installed: dict[str, str], extra_ok: set[str], missing_ok: set[str]
) -> list[str]:
    """What an installation does differently from the lock, one line each (empty when it matches)."""
    found: dict[str, str] = {canonicalize_name(name): version for name, version in installed.items()}
    lines = [
        f"{name}: locked {version}, installed {found[name]}"
        for name, version in sorted(locked.items())
        if name in found and found[name] != version
    ]
    lines += [f"{name}: locked {locked[name]}, not installed" for name in sorted(set(locked) - set(found) - missing_ok)]
    lines += [
        f"{name}: installed {found[name]}, not in the lock" for name in sorted(set(found) - set(locked) - extra_ok)
    ]
    return lines
