"""Every pattern of the CRD reads alike in the three engines that apply it.

The apiserver checks a CRD `pattern` (and CEL's `matches()`) with Go's RE2; pydantic, hence
`ftjob validate` and the operator, with Rust's regex; the Python-side checks with `re`. Their
`\\s`, `\\S`, `\\d` and `\\w` differ beyond ASCII: RE2's `\\S` admits a leading U+0085, vertical tab
or NBSP that the other two refuse, so validate and the apiserver once disagreed on experiment
names. Here every pattern meets near-valid values with hostile characters before, inside and
after them, and the three verdicts must agree; RE2 is Google's C++ library, which has Go's syntax.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
import re2  # type: ignore[import-untyped]  # google-re2: no stubs
import yaml
from pydantic import Field, TypeAdapter, ValidationError

from finetune_operator.api import crdgen
from finetune_operator.api.spec import PATTERN_HINTS

pytestmark = pytest.mark.timeout(120)

SEEDS = [
    "a", "ab", "x1", "a b", "/a/b", "/", "org/model", "hf://org/model@main", "pvc://claim/p", "file:///x",
    "s3://bucket/key", "s3://bucket/a/", "builtin://tiny-llama", "http://h:80/p", "https://h.example.com",
    "us-east-1", "80Gi", "500m", "main", "v1.0", "token", ".x", "team.example.com/owner", "My Experiment",
    "ghcr.io/x/y:1", "q_proj", "9", "True",
]  # fmt: skip
HOSTILE = ["\x85", "\x0b", "\xa0", "\x0c", "\t", "\n", "\r", " ", "\x00", "\x1c", "\x7f", "\x9f",
           "\u2028", "\u3000", "\u1680", "\ufeff", "é", "٣", "\U0001f600"]  # fmt: skip


def probes() -> Iterator[str]:
    for seed in SEEDS:
        yield seed
        for char in HOSTILE:
            yield char + seed
            yield seed + char
            yield seed[:1] + char + seed[1:]


def crd_patterns() -> list[tuple[str, str]]:
    """(where, pattern) for every `pattern` of the generated CRD, once each."""
    found: dict[str, str] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.setdefault(node["pattern"], path)
            for key, value in node.items():
                walk(value, f"{path}.{key}" if key != "properties" else path)
        elif isinstance(node, list):
            for value in node:
                walk(value, path)

    walk(yaml.safe_load(crdgen.render_crd())["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")
    return [(where, pattern) for pattern, where in found.items()]


def pydantic_admits(adapter: TypeAdapter[str], value: str) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("where", "pattern"), crd_patterns(), ids=[w for w, _ in crd_patterns()])
def test_re2_rust_and_python_agree_on_every_crd_pattern(where: str, pattern: str) -> None:
    adapter: TypeAdapter[str] = TypeAdapter(Annotated[str, Field(pattern=pattern)])
    disagree = []
    for value in probes():
        go = re2.search(pattern, value) is not None
        rust = pydantic_admits(adapter, value)
        python = re.fullmatch(pattern, value) is not None
        if not go == rust == python:
            disagree.append(f"{value!r}: RE2 {go}, pydantic {rust}, re {python}")
    assert not disagree, f"{where} {pattern}:\n" + "\n".join(disagree[:10])


def test_the_hf_endpoint_rule_reads_alike_in_cel_and_python() -> None:
    from finetune_operator.api.base import HTTP_URL_PATTERN

    for value in probes():
        assert (re2.search(HTTP_URL_PATTERN, value) is not None) == (re.fullmatch(HTTP_URL_PATTERN, value) is not None)


def test_every_spec_pattern_has_a_message_in_words() -> None:
    raw = [(where, p) for where, p in crd_patterns() if where.startswith(".spec") and p not in PATTERN_HINTS]
    assert raw == []


def test_the_rules_python_checks_read_their_cel_patterns_as_re2_does() -> None:
    from finetune_operator.api.object_storage import FORBIDDEN_BUCKET
    from finetune_operator.api.spec import DOT_DOT_SEGMENT, has_dot_dot
    from finetune_operator.api.storage_uri import PINNED_HUB_ID

    uris = [*probes(), "a/..", "a/..\n", "../x", "s3://a..b/x", "s3://1.2.3.4/x", "s3://xn--a/x", "s3://b.mrap/x"]
    for value in uris:
        assert has_dot_dot(value) == (re2.search(DOT_DOT_SEGMENT, value) is not None), repr(value)
        for pattern in (PINNED_HUB_ID, FORBIDDEN_BUCKET):
            assert (re.search(pattern, value) is None) == (re2.search(pattern, value) is None), repr(value)
