"""No test module imports another test module.

Helpers and builders that several modules use live in `tests/support/` (or `tests/factories.py`,
`tests/crd_schema.py`, a tier's harness module). A test module imported as a library runs its
module-level code in the importer, hides which tests a change can break, and grows private names
(`_sts`) that other files depend on. Every `tests/**/test_*.py` is parsed here, so an import of
one (absolute, relative, or as `from tests.unit import test_x`) fails naming both files.

Nothing imports a `conftest.py` either (pytest loads those itself; one imported as a library by
another tier or a benchmark is a helper module under the wrong name): every Python file under
tests/ and benchmarks/ is checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

PENDING: dict[str, set[str]] = {}
"""Imports still waiting for their helpers to move to a support module. Each entry must still
occur: once fixed, the test asks to remove it."""


def _named_modules(tree: ast.AST, package: tuple[str, ...]) -> Iterator[str]:
    """Every dotted name an import statement may refer to as a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *((node.module or "").split(".") if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)  # `from tests.unit import test_x`


def imported_test_modules(source: str, package: tuple[str, ...]) -> set[str]:
    """The test modules (`test_*.py` files under tests/) that `source`, a module of `package`, imports."""
    found = set()
    for name in _named_modules(ast.parse(source), package):
        path = REPO.joinpath(*name.split(".")).with_suffix(".py")
        if name.startswith("tests.") and path.name.startswith("test_") and path.is_file():
            found.add(name)
    return found


def imported_conftests(source: str, package: tuple[str, ...]) -> set[str]:
    """The conftest modules that `source`, a module of `package`, imports by any form."""
    names = set(_named_modules(ast.parse(source), package))
    return {n for n in names if n == "conftest" or n.endswith(".conftest")}


def _imports_of_every_test_module() -> dict[str, set[str]]:
    imports = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        package = path.relative_to(REPO).parent.parts
        found = imported_test_modules(path.read_text(), package)
        if found:
            imports[path.relative_to(REPO).as_posix()] = found
    return imports


def test_no_test_module_imports_another() -> None:
    imports = _imports_of_every_test_module()
    offending = {
        f"{module} imports {target}"
        for module, targets in imports.items()
        for target in targets - PENDING.get(module, set())
    }
    assert not offending, (
        "test modules import other test modules; move the shared names to tests/support/:\n  "
        + "\n  ".join(sorted(offending))
    )
    stale = {
        f"{module} no longer imports {target}"
        for module, targets in PENDING.items()
        for target in targets - imports.get(module, set())
    }
    assert not stale, "remove from PENDING:\n  " + "\n  ".join(sorted(stale))


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("from tests.unit.test_lifecycle import pod", ("tests", "robustness"), {"tests.unit.test_lifecycle"}),
        ("from .test_lifecycle import pod", ("tests", "unit"), {"tests.unit.test_lifecycle"}),
        ("from ..unit.test_lifecycle import pod", ("tests", "cluster"), {"tests.unit.test_lifecycle"}),
        ("from tests.unit import test_lifecycle", ("tests", "cluster"), {"tests.unit.test_lifecycle"}),
        ("from . import test_lifecycle", ("tests", "unit"), {"tests.unit.test_lifecycle"}),
        ("import tests.unit.test_lifecycle as lc", ("tests", "cluster"), {"tests.unit.test_lifecycle"}),
        ("def f():\n    from tests.unit.test_lifecycle import run", ("tests", "unit"), {"tests.unit.test_lifecycle"}),
        ("from tests.support.lifecycle import pod\nfrom tests.factories import make_job", ("tests", "unit"), set()),
        ("from tests.cluster.operator_harness import Jobs\nimport pytest", ("tests", "robustness"), set()),
        ("from .conftest import x\nfrom . import documents", ("tests", "robustness"), set()),
    ],
    ids=[
        "absolute",
        "relative",
        "relative-parent",
        "module-from-package",
        "module-from-own-package",
        "import-as",
        "inside-a-function",
        "support-modules",
        "harness-module",
        "conftest-and-sibling",
    ],
)
def test_every_form_of_import_is_seen(source: str, package: tuple[str, ...], expected: set[str]) -> None:
    assert imported_test_modules(source, package) == expected


def test_nothing_imports_a_conftest() -> None:
    offending = []
    for root in ("tests", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            found = imported_conftests(path.read_text(), path.relative_to(REPO).parent.parts)
            offending += [f"{path.relative_to(REPO)} imports {name}" for name in sorted(found)]
    assert not offending, "move the shared names to tests/support/:\n  " + "\n  ".join(offending)


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("from .conftest import Run", ("tests", "trainer"), {"tests.trainer.conftest"}),
        ("from tests.trainer.conftest import REPO", ("tests", "prometheus"), {"tests.trainer.conftest"}),
        ("from . import conftest", ("tests", "trainer"), {"tests.trainer.conftest"}),
        ("def f():\n    from tests.trainer.conftest import x", ("benchmarks",), {"tests.trainer.conftest"}),
        ("from tests.support.training_runs import Run", ("tests", "trainer"), set()),
    ],
    ids=["relative", "another-tier", "module-from-package", "inside-a-function", "support-module"],
)
def test_every_form_of_conftest_import_is_seen(source: str, package: tuple[str, ...], expected: set[str]) -> None:
    assert imported_conftests(source, package) == expected
