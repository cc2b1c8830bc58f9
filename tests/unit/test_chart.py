"""The Helm chart, rendered offline with the real `helm` binary: shape, least-privilege RBAC, Pod Security.

Why offline: `helm template` runs the chart's templates and values.schema.json exactly as an
install does, in a fraction of a second, so every value combination can be checked without a
cluster (the cluster tier installs it for real). The RBAC tests load the operator's declared
needs from `handlers/permissions.py` and demand the rendered roles grant exactly those.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.handlers.permissions import KUEUE, KUEUE_CLUSTER, OPTIONAL, REQUIRED, Permission
from finetune_operator.render.identity import labels as job_labels
from tests.factories import REPO_ROOT, make_job

CHART = REPO_ROOT / "charts" / "finetune-operator"
RELEASE, NAMESPACE = "ftjob", "ftjob-system"
Obj = dict[str, Any]
ALL_ON = (
    "serviceMonitor.enabled=true",
    "podMonitor.enabled=true",
    "dashboards.enabled=true",
    "prometheusRule.enabled=true",
    "helmTest.enabled=true",
    "operator.verbose=true",
)
RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/component",
)


def _find_helm() -> Path | None:
    try:
        from finetune_localcluster.binaries import cached_binaries

        cached = cached_binaries().helm
    except ImportError:  # the harness package is optional for this tier
        cached = None
    if cached is not None and os.access(cached, os.X_OK):
        return cached
    found = shutil.which("helm")
    return Path(found) if found else None


HELM = _find_helm()
needs_helm = pytest.mark.skipif(
    HELM is None,
    reason="helm binary not found in ~/.cache/finetune-operator/helm/ or on PATH: "
    "run tools/build-kube-binaries.sh (scripts/bootstrap.sh does)",
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


@functools.cache
def _render(sets: tuple[str, ...], json_sets: tuple[str, ...]) -> tuple[Obj, ...]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    for s in json_sets:
        args += ["--set-json", s]
    out = helm(*args).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def render(*sets: str, json_sets: tuple[str, ...] = ()) -> list[Obj]:
    return [json.loads(json.dumps(o)) for o in _render(tuple(sets), json_sets)]  # a private copy per test


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Obj], kind: str) -> Obj:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_specs(objects: list[Obj]) -> list[tuple[str, Obj]]:
    out = []
    for o in objects:
        if o["kind"] == "Pod":
            out.append((o["metadata"]["name"], o["spec"]))
        elif o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            out.append((o["metadata"]["name"], o["spec"]["template"]["spec"]))
    return out


# ----------------------------------------------------------------------------- lint and shape


@needs_helm
@pytest.mark.parametrize("sets", [(), ALL_ON, (*ALL_ON, "podMonitor.perJob=true", "watchNamespaces={a,b}")])
def test_helm_lint_is_clean(sets: tuple[str, ...]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_helm
def test_default_render_has_the_operator_and_nothing_optional() -> None:
    kinds = sorted(o["kind"] for o in render())
    expected = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment", "Pod"]
    assert kinds == sorted([*expected, "ConfigMap", "ConfigMap"])


@needs_helm
def test_every_feature_on_renders_the_monitors() -> None:
    objects = render(*ALL_ON)
    assert one(objects, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"
    assert one(objects, "PodMonitor")["spec"]["namespaceSelector"] == {"any": True}


@needs_helm
@pytest.mark.parametrize("sets", [(), ALL_ON, (*ALL_ON, "watchNamespaces={team-a,team-b}")])
def test_every_object_is_namespaced_and_labelled(sets: tuple[str, ...]) -> None:
    for o in render(*sets):
        assert o["apiVersion"] and o["kind"] and o["metadata"]["name"], o
        labels = o["metadata"].get("labels", {})
        missing = [k for k in RECOMMENDED_LABELS if k not in labels]
        assert not missing, f"{o['kind']}/{o['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert len(o["metadata"]["name"]) <= 63
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"].get("namespace"), f"{o['kind']}/{o['metadata']['name']} has no namespace"


@needs_helm
def test_operator_disabled_leaves_what_does_not_need_it() -> None:
    # Dashboards, the trainers' PodMonitor and the jobs' alerts serve a Grafana/Prometheus whatever
    # runs the operator.
    assert {o["kind"] for o in render("operator.enabled=false", *ALL_ON)} == {
        "ConfigMap",
        "PodMonitor",
        "PrometheusRule",
    }


@needs_helm
@pytest.mark.parametrize("override", ["fullnameOverride", "nameOverride"])
def test_names_are_cut_at_63_characters(override: str) -> None:
    for o in render(f"{override}={'x' * 80}", *ALL_ON):
        assert len(o["metadata"]["name"]) <= 63, o["metadata"]["name"]
        assert not o["metadata"]["name"].endswith("-")


# ----------------------------------------------------------------------------- RBAC


def _granted(rule: Obj) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _needed(permissions: tuple[Permission, ...]) -> set[tuple[str, str, str]]:
    return {(p.api_group, p.resource, v) for p in permissions for v in p.verbs}


RBAC_CASES = [
    pytest.param((), False, id="cluster-wide"),
    pytest.param(("podMonitor.enabled=true",), False, id="cluster-wide+chart-podmonitor"),
    pytest.param(("podMonitor.enabled=true", "podMonitor.perJob=true"), True, id="cluster-wide+per-job-podmonitor"),
    pytest.param(("watchNamespaces={team-a,team-b}",), False, id="namespaced"),
    pytest.param(
        ("watchNamespaces={team-a,team-b}", "podMonitor.enabled=true", "podMonitor.perJob=true"),
        True,
        id="namespaced+per-job-podmonitor",
    ),
    pytest.param(("kueue.enabled=true",), False, id="cluster-wide+kueue"),
    pytest.param(("watchNamespaces={team-a,team-b}", "kueue.enabled=true"), False, id="namespaced+kueue"),
]


def _kueue_role(objects: list[Obj]) -> list[Obj]:
    return [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("-kueue")]


@needs_helm
@pytest.mark.parametrize(("sets", "with_optional"), RBAC_CASES)
def test_roles_grant_exactly_what_the_operator_declares(sets: tuple[str, ...], with_optional: bool) -> None:
    objects = render(*sets)
    kueue = "kueue.enabled=true" in sets
    expected = _needed(REQUIRED) | (_needed(OPTIONAL) if with_optional else set())
    expected |= _needed(KUEUE) if kueue else set()
    namespaced = any(s.startswith("watchNamespaces=") for s in sets)
    flavors = _kueue_role(objects)
    assert len(flavors) == int(kueue)
    for role in flavors:  # cluster-scoped ResourceFlavors: a ClusterRole even for a namespaced operator
        assert set().union(*(_granted(rule) for rule in role["rules"])) == _needed(KUEUE_CLUSTER)
    cluster_roles = [r for r in of_kind(objects, "ClusterRole") if r not in flavors]
    roles = of_kind(objects, "Role") if namespaced else cluster_roles
    assert roles
    if namespaced:
        assert not cluster_roles and len(of_kind(objects, "ClusterRoleBinding")) == len(flavors)
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        granted: set[tuple[str, str, str]] = set()
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames or nonResourceURLs"
            granted |= _granted(rule)
        assert granted == expected, f"extra: {granted - expected}; missing: {expected - granted}"


@needs_helm
@pytest.mark.parametrize(("sets", "with_optional"), RBAC_CASES)
def test_bindings_tie_the_roles_to_the_operator_service_account(sets: tuple[str, ...], with_optional: bool) -> None:
    objects = render(*sets)
    account = one(objects, "ServiceAccount")["metadata"]
    deployment = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert deployment["serviceAccountName"] == account["name"]
    bindings = of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding")
    roles = {
        (r["kind"], r["metadata"]["name"], r["metadata"].get("namespace"))
        for r in of_kind(objects, "Role") + of_kind(objects, "ClusterRole")
    }
    assert len(bindings) == len(roles)
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]
        assert (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace")) in roles
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--pod-monitor" in args) == with_optional
    assert ("--kueue" in args) == ("kueue.enabled=true" in sets)


@needs_helm
@pytest.mark.parametrize("sets", [(), (*ALL_ON, "podMonitor.perJob=true"), ("watchNamespaces={a}",)])
def test_no_wildcards_and_no_secrets(sets: tuple[str, ...]) -> None:
    for role in of_kind(render(*sets), "Role") + of_kind(render(*sets), "ClusterRole"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"wildcard in {key}: {rule}"
            assert "secrets" not in rule["resources"]


# ----------------------------------------------------------------------------- Pod Security


ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(spec: Obj) -> list[str]:
    """The checks of the Restricted Pod Security Standard (Kubernetes 1.29+) that apply to a pod spec."""
    problems = []
    pod_ctx = spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(flag)
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"volume {volume['name']}: {kinds}")
    for c in spec.get("initContainers", []) + spec["containers"]:
        ctx = c.get("securityContext", {})
        where = f"container {c['name']}"
        if ctx.get("privileged"):
            problems.append(f"{where}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            problems.append(f"{where}: runAsNonRoot")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            problems.append(f"{where}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile {seccomp}")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds {caps['add']}")
        if any("hostPort" in p for p in c.get("ports", [])):
            problems.append(f"{where}: hostPort")
    return problems


@needs_helm
@pytest.mark.parametrize("sets", [(), ALL_ON])
def test_every_pod_passes_the_restricted_standard(sets: tuple[str, ...]) -> None:
    specs = pod_specs(render(*sets))
    assert {name for name, _ in specs} == {f"{RELEASE}-finetune-operator", f"{RELEASE}-finetune-operator-test-metrics"}
    for name, spec in specs:
        assert restricted_violations(spec) == [], name
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
            assert c["resources"]["limits"]["memory"], name


@needs_helm
def test_the_test_pod_has_no_token_and_no_shell() -> None:
    pod = one(render(), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["restartPolicy"] == "Never"
    command = pod["spec"]["containers"][0]["command"]
    assert command[0] == "python3" and "sh" not in command[0]
    service = one(render(), "Service")
    assert command[-1] == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:8080/metrics"


# ----------------------------------------------------------------------------- the operator's arguments


def _operator_args(objects: list[Obj], monkeypatch: pytest.MonkeyPatch) -> Any:
    import argparse

    from finetune_operator.cli import operator_cmd

    for name in list(os.environ):
        if name.startswith("FTJOB_"):
            monkeypatch.delenv(name)
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["ftjob", "operator"]
    parser = argparse.ArgumentParser()
    operator_cmd.configure(parser)
    return parser.parse_args(container["args"]), container


@needs_helm
def test_deployment_arguments_parse_with_the_real_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    args, container = _operator_args(render(), monkeypatch)
    assert args.namespace == [] and not args.pod_monitor and not args.verbose
    assert args.trainer_image == "ghcr.io/finetune-operator/trainer:0.1.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": args.metrics_port, "health": args.health_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


@needs_helm
def test_values_reach_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(
        "watchNamespaces={team-a,team-b}",
        "operator.metricsPort=9090",
        "operator.healthPort=9091",
        "operator.reconcileInterval=2.5",
        "operator.trainerImage.tag=dev",
        "podMonitor.enabled=true",
        "podMonitor.perJob=true",
        "operator.verbose=true",
    )
    args, _ = _operator_args(objects, monkeypatch)
    assert args.namespace == ["team-a", "team-b"]
    assert (args.metrics_port, args.health_port, args.interval) == (9090, 9091, 2.5)
    assert args.trainer_image == "ghcr.io/finetune-operator/trainer:dev" and args.pod_monitor and args.verbose
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


@needs_helm
def test_scheduling_policy_values_reach_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    args, _ = _operator_args(render(), monkeypatch)
    assert (args.allowed_priority_class, args.allowed_toleration_key, args.allow_tolerate_all) == ([], [], False)
    objects = render(
        "operator.policy.allowedPriorityClasses={training-low,training-high}",
        "operator.policy.allowedTolerationKeys={dedicated}",
        "operator.policy.allowTolerateAll=true",
    )
    args, _ = _operator_args(objects, monkeypatch)
    assert args.allowed_priority_class == ["training-low", "training-high"]
    assert args.allowed_toleration_key == ["dedicated"] and args.allow_tolerate_all
    assert not args.allow_service_account_token_volumes


@needs_helm
def test_the_token_volume_policy_reaches_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    args, _ = _operator_args(render("operator.policy.allowServiceAccountTokenVolumes=true"), monkeypatch)
    assert args.allow_service_account_token_volumes


@needs_helm
def test_the_default_tracking_uri_reaches_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    args, _ = _operator_args(render(), monkeypatch)
    assert args.default_tracking_uri is None
    args, _ = _operator_args(render("tracking.mlflow.trackingUri=http://mlflow.mlflow.svc:5000"), monkeypatch)
    assert args.default_tracking_uri == "http://mlflow.mlflow.svc:5000"


@needs_helm
@pytest.mark.parametrize("placement", ["memory", "product", "resource"])
def test_the_gpu_placement_value_reaches_the_render_options(monkeypatch: pytest.MonkeyPatch, placement: str) -> None:
    """Clusters without GPU Feature Discovery (GKE's default, EKS with only the device plugin) place
    by another label or by the device plugin's resource alone; GFD's memory label is the default."""
    from finetune_operator.cli.operator_settings import render_options

    args, _ = _operator_args(render(), monkeypatch)
    assert render_options(args).gpu_placement == "memory"
    args, _ = _operator_args(render(f"gpuPlacement={placement}"), monkeypatch)
    assert render_options(args).gpu_placement == placement


@needs_helm
def test_operator_runs_alone() -> None:
    spec = one(render(), "Deployment")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


# ----------------------------------------------------------------------------- monitors and dashboards


@needs_helm
def test_chart_pod_monitor_selects_trainer_pods_and_names_the_job() -> None:
    monitor = one(render("podMonitor.enabled=true", "podMonitor.ranksPerNode=4", "watchNamespaces={a}"), "PodMonitor")
    trainer_labels = job_labels(make_job(), "trainer")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= trainer_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["a"]}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["metrics-0", "metrics-1", "metrics-2", "metrics-3"]
    for e in endpoints:
        assert e["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_label_finetune_dev_job_name"], "targetLabel": "finetune_job"}
        ]


@needs_helm
def test_per_job_pod_monitors_are_the_operators_job() -> None:
    assert not of_kind(render("podMonitor.enabled=true", "podMonitor.perJob=true"), "PodMonitor")


@needs_helm
def test_service_monitor_keeps_the_jobs_namespace_label() -> None:
    monitor = one(render("serviceMonitor.enabled=true", "serviceMonitor.labels.release=kps"), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    service = one(render(), "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


@needs_helm
@pytest.mark.parametrize(("label", "value"), [("grafana_dashboard", "1"), ("my.org/dashboard", "yes")])
def test_dashboards_are_config_maps_with_the_files_verbatim(label: str, value: str) -> None:
    objects = render(f"dashboards.label={label}", f"dashboards.labelValue={value}", "dashboards.namespace=grafana")
    maps = of_kind(objects, "ConfigMap")
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert len(maps) == len(files) >= 2
    data = {key: text for m in maps for key, text in m["data"].items()}
    for m in maps:
        assert m["metadata"]["labels"][label] == value
        assert m["metadata"]["namespace"] == "grafana"
    for path in files:
        # .Files.Get copies the file; YAML's block scalar drops only the final newline.
        assert data[path.name] == path.read_text().rstrip("\n")
        assert "{{" in data[path.name], "Grafana legends survive unescaped"
        json.loads(data[path.name])


@needs_helm
@pytest.mark.parametrize("operator", [True, False])
def test_the_prometheus_rule_ships_the_rule_files_as_they_are(operator: bool) -> None:
    # One source: the groups of rules/*.yaml, which the promtool unit tests read, reach the
    # PrometheusRule unchanged (Prometheus' {{ $labels.x }} templates included); the operator's
    # alerts only with the operator.
    sets = (
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=kps",
        f"operator.enabled={str(operator).lower()}",
    )
    rule = one(render(*sets), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == NAMESPACE
    files = ["jobs.yaml", "operator.yaml"] if operator else ["jobs.yaml"]
    groups = [g for f in files for g in yaml.safe_load((CHART / "rules" / f).read_text())["groups"]]
    assert rule["spec"]["groups"] == groups
    assert "{{ $labels.finetune_job }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]


@needs_helm
def test_the_prometheus_rule_is_opt_in_and_can_live_with_prometheus() -> None:
    assert not of_kind(render(), "PrometheusRule")
    rule = one(render("prometheusRule.enabled=true", "prometheusRule.namespace=monitoring"), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"


@needs_helm
def test_dashboards_can_be_switched_off() -> None:
    assert not of_kind(render("dashboards.enabled=false"), "ConfigMap")


# ----------------------------------------------------------------------------- values and their schema


@needs_helm
@pytest.mark.parametrize(
    "bad",
    [
        "operator.metricsPort=http",
        "operator.metricsPort=70000",
        "operator.image.pullPolicy=Sometimes",
        "operatr.enabled=true",
        "watchNamespaces={Not_A_Namespace}",
        "podMonitor.ranksPerNode=0",
        "serviceMonitor.interval=soon",
        "operator.reconcileInterval=-1",
        "tracking.mlflow.trackingUri=mlflow.example.com",
        "tracking.mlflow.trackingUri=http://user:secret@mlflow.example.com",
        "gpuPlacement=gfd",
    ],
)
def test_schema_rejects_bad_values(bad: str) -> None:
    result = helm("template", RELEASE, str(CHART), "--set", bad, check=False)
    assert result.returncode != 0
    assert "schema" in result.stderr.lower(), result.stderr


@needs_helm
def test_schema_rejects_a_string_where_a_boolean_belongs() -> None:
    result = helm("template", RELEASE, str(CHART), "--set-string", "operator.verbose=yes", check=False)
    assert result.returncode != 0 and "schema" in result.stderr.lower(), result.stderr


def _schema_paths(schema: Obj, prefix: str = "") -> list[str]:
    """Dotted paths of every property the schema names (free-form maps stop the descent)."""
    out = []
    for name, sub in schema.get("properties", {}).items():
        if name == "global":
            continue
        path = f"{prefix}{name}"
        out.append(path)
        out += _schema_paths(sub, path + ".")
    return out


def _documented_keys(values_yaml: str) -> dict[str, bool]:
    """Dotted path of every mapping key in values.yaml -> whether a comment starting with it precedes it."""
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    out: dict[str, bool] = {}
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if not match or stripped.startswith("-"):
            comments = []
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(name for _, name in stack), match.group(2)])
        out[path] = any(c == path or c.startswith(path + " ") for c in comments)
        stack.append((indent, match.group(2)))
        comments = []
    return out


def test_every_value_is_documented_by_a_comment_starting_with_its_name() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    documented = _documented_keys((CHART / "values.yaml").read_text())
    paths = _schema_paths(schema)
    assert [p for p in paths if p not in documented] == [], "in the schema but not in values.yaml"
    assert [p for p in paths if not documented[p]] == [], "values without a comment that starts with their name"
    assert all(re.fullmatch(r"[a-z][A-Za-z0-9]*", part) for p in paths for part in p.split(".")), "camelCase"


def test_default_values_satisfy_the_schema() -> None:
    import jsonschema  # type: ignore[import-untyped]

    schema = json.loads((CHART / "values.schema.json").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load((CHART / "values.yaml").read_text())))
    assert errors == [], [e.message for e in errors]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["kubeVersion"] == ">=1.29.0-0"
    assert (CHART / "crds" / "finetune.dev_finetunejobs.yaml").is_file()
    assert (CHART / "templates" / "NOTES.txt").is_file()


def test_the_chart_readme_values_reference_is_generated_from_values_yaml() -> None:
    from tools.chart_docs import stale, undocumented
    from tools.chart_docs.__main__ import main

    assert undocumented((CHART / "values.yaml").read_text()) == [], "document each value with `# key -- text`"
    assert not stale(), "run `python -m tools.chart_docs` and commit the chart README"
    assert main(["--check"]) == 0


def test_the_values_reference_notices_an_undocumented_or_changed_value() -> None:
    from tools.chart_docs import BEGIN, END, reference, rendered_readme, undocumented

    text = (CHART / "values.yaml").read_text()
    without = text.replace("  # operator.verbose -- debug logging.\n", "")
    assert without != text
    assert undocumented(without) == ["operator.verbose"]
    readme = f"intro\n{BEGIN}\n{END}\n"
    current = rendered_readme(readme, text)
    assert "| `operator.reconcileWorkers` | `16` | jobs reconciled in parallel" in current
    assert rendered_readme(current, text) == current  # regenerating is stable
    changed = rendered_readme(current, text.replace("reconcileWorkers: 16", "reconcileWorkers: 4"))
    assert changed != current and "| `operator.reconcileWorkers` | `4` |" in changed
    with pytest.raises(KeyError):
        reference(text + "# ghost.key -- documented but not a value\n")
    with pytest.raises(ValueError, match="marker lines"):
        rendered_readme("a README without the markers\n", text)


@needs_helm
def test_object_storage_values_become_the_operators_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from finetune_operator.cli.operator_settings import object_storage_defaults

    args, _ = _operator_args(render(), monkeypatch)
    assert object_storage_defaults(args).model_dump(exclude_none=True) == {}
    objects = render(
        "objectStorage.endpoint=https://s3.internal:9000",
        "objectStorage.region=eu-1",
        "objectStorage.pathStyle=true",
        "objectStorage.caBundle.configMapName=corp-ca",
    )
    args, _ = _operator_args(objects, monkeypatch)
    defaults = object_storage_defaults(args)
    assert (defaults.endpoint, defaults.region, defaults.path_style) == ("https://s3.internal:9000", "eu-1", True)
    assert defaults.ca_bundle is not None and (defaults.ca_bundle.name, defaults.ca_bundle.key) == ("corp-ca", "ca.crt")
