"""Print the Python requirements of an image's dependency layer, read from pyproject.toml.

The trainer image installs its dependencies in a cached layer apart from the project's own
source. That layer installs exactly what this prints, and scripts/build-images.sh hashes exactly
what this prints: an edit to pyproject.toml that leaves the requirements alone (a linter
setting, a test marker) reuses the cached layer, and an edit to any requirement rebuilds it.

    python3 requirements.py PYPROJECT [EXTRA...]

prints the build system's requirements (the source is installed later without build isolation,
so its backend must already be there), the project's dependencies and those of each EXTRA, one
per line. Standard library only: it runs in the image's bare Python before anything is installed.
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: dict[str, object], extras: list[str]) -> list[str]:
    build_system = pyproject.get("build-system")
    project = pyproject.get("project")
    if not isinstance(build_system, dict) or not isinstance(project, dict):
        raise SystemExit("pyproject.toml: needs [build-system] and [project] tables")
    lines = [*build_system.get("requires", []), *project.get("dependencies", [])]
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"pyproject.toml: no optional-dependencies extra {extra!r} (have {sorted(optional)})")
        lines += optional[extra]
    return [str(line) for line in lines]


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    with open(argv[1], "rb") as file:
        pyproject = tomllib.load(file)
    print("\n".join(requirements(pyproject, argv[2:])))


if __name__ == "__main__":
    main(sys.argv)
