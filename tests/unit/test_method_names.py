"""Code compares a fine-tuning method with `api.methods.MethodType`, never with its spelling.

The method is an enum of the API; a comparison with the string `"qlora"` keeps working while the
enum changes under it (a renamed or added member), and a typo in one (`"QLoRA"`) is silently never
true. Every Python file of the operator, the trainer and the benchmarks is parsed here, and a
comparison (`==`, `!=`, `in`, `not in`) with a method's name as a string literal fails naming the
file and line. Strings elsewhere (a manifest's `"type": "lora"`, CEL rules) are data, not compared.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from finetune_operator.api.methods import MethodType

REPO = Path(__file__).resolve().parents[2]
SOURCES = (REPO / "operator" / "finetune_operator", REPO / "trainer_image" / "finetune_trainer", REPO / "benchmarks")
METHOD_NAMES = frozenset(member.value for member in MethodType)
EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _literals(node: ast.expr) -> list[str]:
    """The string constants `node` is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [value for element in node.elts for value in _literals(element)]
    return []


def method_name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, method name) of every comparison in `source` with a method's name spelled as a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, EQUALITY) for op in node.ops):
            continue
        for operand in (node.left, *node.comparators):
            found += [(node.lineno, name) for name in _literals(operand) if name in METHOD_NAMES]
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('if workload.method == "full": pass', [(1, "full")]),
        ('x = "qlora" != method', [(1, "qlora")]),
        ('ok = method in ("lora", "qlora")', [(1, "lora"), (1, "qlora")]),
        ("if workload.method == MethodType.FULL: pass", []),
        ('spec = {"method": {"type": "lora"}}', []),
        ('if offload != "none": pass', []),
    ],
)
def test_the_scan_finds_spelled_method_names(source: str, expected: list[tuple[int, str]]) -> None:
    assert method_name_comparisons(source) == expected


def test_no_code_compares_a_method_with_its_spelling() -> None:
    offending = [
        f"{path.relative_to(REPO)}:{line}: compares with {name!r}; use MethodType.{MethodType(name).name}"
        for root in SOURCES
        for path in sorted(root.rglob("*.py"))
        for line, name in method_name_comparisons(path.read_text())
    ]
    assert not offending, "\n".join(offending)
