"""The chart's alerts, unit-tested by `promtool test rules` (tests/prometheus/alerts.test.yaml).

promtool evaluates the chart's own rule files (charts/finetune-operator/rules/) over series
written in its notation, the labels real scrapes carry, and compares the firing alerts, labels
and rendered annotations at each time. The checks here make that file complete: every alert
has a case where it fires and one where it must not, every alert is labelled and has a runbook,
and the alerts page documents exactly these alerts.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.prometheus_server import PROMTOOL
from tests.support.training_runs import REPO

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(120)]

RULES = REPO / "charts" / "finetune-operator" / "rules"
UNIT_TESTS = Path(__file__).with_name("alerts.test.yaml")
ALERTS_PAGE = REPO / "docs" / "guides" / "alerts.md"


def rules_by_group() -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(RULES.glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            groups[group["name"]] = group["rules"]
    return groups


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rules in rules_by_group().values() for rule in rules if "alert" in rule}


def test_the_rule_files_pass_promtool_check() -> None:
    files = sorted(str(p) for p in RULES.glob("*.yaml"))
    assert len(files) == 2
    checked = subprocess.run([PROMTOOL, "check", "rules", *files], check=False, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", str(UNIT_TESTS)], check=False, capture_output=True, text=True, cwd=REPO
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_read_the_charts_rule_files() -> None:
    listed = yaml.safe_load(UNIT_TESTS.read_text())["rule_files"]
    assert sorted((UNIT_TESTS.parent / f).resolve() for f in listed) == sorted(RULES.glob("*.yaml"))


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for name in alerts():
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name}: no promtool case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: no promtool case where it must stay quiet"
    assert {case["alertname"] for case in cases} <= set(alerts()), "a case names an alert the chart does not ship"


@pytest.mark.parametrize("group", ["finetune-jobs", "finetune-operator"])
def test_every_alert_names_its_target_and_has_a_severity_and_a_runbook(group: str) -> None:
    # A job's alerts are aggregated by the job (namespace, finetune_job); the operator's keep
    # Prometheus' job label and the operator's namespace.
    identity = ("namespace", "finetune_job") if group == "finetune-jobs" else ("namespace", "job")
    cases = {
        case["alertname"]: alert["exp_labels"]
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        for alert in case["exp_alerts"]
    }
    for rule in rules_by_group()[group]:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        assert all(cases[name].get(label) for label in identity), f"{name} fires without {identity}: {cases[name]}"
        assert "{{ $labels.namespace }}" in rule["annotations"]["summary"], name


def test_the_alerts_page_documents_exactly_the_shipped_alerts() -> None:
    page = ALERTS_PAGE.read_text()
    assert sorted(re.findall(r"^### (\w+)$", page, flags=re.MULTILINE)) == sorted(alerts())
    for path in sorted(RULES.glob("*.yaml")):  # the rules as shipped, included by mkdocs' snippets
        assert f'--8<-- "{path.relative_to(REPO)}"' in page, path
