"""The trainer's attributes are all assigned in `Trainer.__init__` or `Trainer.setup`.

A method that stores a new attribute on the trainer hides part of its state from the one
place a reader looks for it (and from mypy's view of what exists before `setup` ran). The
builders in `finetune_trainer.rank.rank_setup` return what they build; `setup` assigns it. This
test parses loop.py, so the rule holds for every method, called or not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LOOP = Path(__file__).resolve().parents[2] / "trainer_image" / "finetune_trainer" / "rank" / "loop.py"
BUILDERS = ("__init__", "setup")
"""The methods that may give the trainer a new attribute."""

Method = ast.FunctionDef | ast.AsyncFunctionDef


def _stored_attributes(method: Method) -> set[str]:
    """Every `self.X` the method stores into (assignment, annotated or augmented assignment,
    tuple unpacking, a `for` or `with` target)."""
    if not method.args.args:
        return set()
    me = method.args.args[0].arg
    return {
        node.attr
        for node in ast.walk(method)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == me
    }


def _hidden_stores(method: Method) -> list[str]:
    """Stores the attribute walk cannot name: `setattr(self, ...)` and `self.__dict__`."""
    if not method.args.args:
        return []
    me = method.args.args[0].arg
    found = []
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == me
        ):
            found.append(f"{method.name}: setattr({me}, ...)")
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "__dict__"
            and isinstance(node.value, ast.Name)
            and node.value.id == me
        ):
            found.append(f"{method.name}: {me}.__dict__")
    return found


def attributes_first_set_elsewhere(source: str, class_name: str = "Trainer") -> list[str]:
    """`method: attribute` for each attribute a method other than `__init__`/`setup` stores
    without either of them assigning it, plus any store made through setattr or __dict__."""
    tree = ast.parse(source)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    assert classes, f"no class {class_name} in the source"
    methods = [node for node in classes[0].body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    allowed: set[str] = set().union(*(_stored_attributes(m) for m in methods if m.name in BUILDERS))
    offending = []
    for method in methods:
        hidden = _hidden_stores(method)
        offending.extend(hidden)
        if method.name in BUILDERS:
            continue
        offending.extend(f"{method.name}: {name}" for name in sorted(_stored_attributes(method) - allowed))
    return offending


def test_every_trainer_attribute_is_first_assigned_in_init_or_setup() -> None:
    offending = attributes_first_set_elsewhere(LOOP.read_text())
    assert not offending, (
        "Trainer methods give it attributes that neither __init__ nor setup assigns; return the value "
        "from a builder (finetune_trainer.rank.rank_setup) and assign it in setup:\n  " + "\n  ".join(offending)
    )


def test_the_builders_exist() -> None:
    """The rule is vacuous if `setup` is renamed: the allowed set would silently shrink to __init__."""
    tree = ast.parse(LOOP.read_text())
    trainer = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Trainer")
    names = {node.name for node in trainer.body if isinstance(node, ast.FunctionDef)}
    assert set(BUILDERS) <= names


CLASS = (
    "class Trainer:\n    def __init__(self):\n        self.cfg = 1\n\n    def setup(self):\n        self.engine = 2\n\n"
)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("    def _load(self):\n        self.rows = []\n", ["_load: rows"]),
        ("    def _load(self):\n        self.rows: list[int] = []\n", ["_load: rows"]),
        ("    def _load(self):\n        self.a, (self.b, _) = 1, (2, 3)\n", ["_load: a", "_load: b"]),
        ("    def _load(self):\n        self.n += 1\n", ["_load: n"]),
        ("    def _load(self):\n        for self.i in range(3):\n            pass\n", ["_load: i"]),
        ("    def _load(me):\n        me.rows = []\n", ["_load: rows"]),
        ("    def _load(self):\n        setattr(self, 'rows', [])\n", ["_load: setattr(self, ...)"]),
        ("    def _load(self):\n        self.__dict__['rows'] = []\n", ["_load: self.__dict__"]),
        ("    def _step(self):\n        self.engine = 3\n        self.cfg = 4\n", []),
        ("    def _step(self):\n        self.engine.global_steps = 5\n        x = self.rows\n", []),
    ],
    ids=[
        "assign",
        "annotated",
        "unpacked",
        "augmented",
        "for-target",
        "other-self-name",
        "setattr",
        "dict",
        "reassigned-is-fine",
        "nested-and-reads-are-fine",
    ],
)
def test_every_form_of_store_is_seen(method: str, expected: list[str]) -> None:
    assert attributes_first_set_elsewhere(CLASS + method) == expected
