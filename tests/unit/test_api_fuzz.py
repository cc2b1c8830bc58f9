"""Property tests: the models and the generated schema agree, and nothing crashes.

Documents are built from menus of valid, boundary and wrong values for every field,
so one corpus holds both accepted and rejected jobs. For each document:
- validation yields a job or clean `path: message` lines, never a traceback;
- pydantic accepts it exactly when the apiserver emulation (structural schema + CEL)
  does;
- an accepted job survives dump → schema validation → parse unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune_operator.api import FineTuneJob
from tests.crd_schema import ApiserverEmulation
from tests.factories import BASE_JOB
from tests.support.job_menu import ABSENT, MENU, OPERATOR_CHECKED, parse_job, set_field

EMULATION = ApiserverEmulation()


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(BASE_JOB)
    for dotted, values in MENU.items():
        value = draw(st.sampled_from(values))
        if value is not ABSENT:
            set_field(doc["spec"], dotted, copy.deepcopy(value))
    return doc


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(documents())
def test_models_and_schema_agree(document: dict[str, Any]) -> None:
    job, lines = parse_job(document)
    schema_problems = EMULATION.problems(document)
    if job is None and not schema_problems and all(line.startswith(OPERATOR_CHECKED) for line in lines):
        return
    assert (job is not None) == (schema_problems == []), (
        f"pydantic: {lines or 'accepted'}; schema: {schema_problems or 'accepted'}"
    )


@FUZZ
@given(documents())
def test_errors_are_lines_naming_a_field(document: dict[str, Any]) -> None:
    job, lines = parse_job(document)
    if job is None:
        assert lines
        for line in lines:
            path, _, message = line.partition(": ")
            assert path and message, line
            assert path.split(".")[0].split("[")[0] in {"spec", "metadata", "apiVersion", "kind"}, line
            assert "Traceback" not in line and "\n" not in line


@FUZZ
@given(documents())
def test_valid_documents_round_trip(document: dict[str, Any]) -> None:
    job, _ = parse_job(document)
    if job is None:
        return
    wire = job.to_wire()
    assert EMULATION.problems(wire) == []
    assert FineTuneJob.from_manifest(wire) == job
