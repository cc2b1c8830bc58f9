"""What an installation lets a job ask of the scheduler: checked before planning, naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from finetune_operator.plan.admission.scheduling_policy import SchedulingPolicy
from finetune_operator.reconcile.decision import PlanFailed
from finetune_operator.reconcile.runner import plan_or_fail
from tests.factories import make_job

EVERYTHING = {"operator": "Exists"}


def _spec(**resources: Any) -> Any:
    return make_job(resources={"numNodes": 1, "gpusPerNode": 8, **resources}).spec


def test_the_default_policy_refuses_system_classes_and_tolerating_every_taint() -> None:
    policy = SchedulingPolicy()
    assert (
        policy.problems(_spec(priorityClassName="training", tolerations=[{"key": "dedicated", "operator": "Exists"}]))
        == []
    )
    (line,) = policy.problems(_spec(priorityClassName="system-node-critical"))
    assert (
        line.startswith("spec.resources.priorityClassName: 'system-node-critical' is not allowed")
        and "system-*" in line
    )
    (line,) = policy.problems(_spec(tolerations=[{"key": "a", "operator": "Exists"}, EVERYTHING]))
    assert line.startswith("spec.resources.tolerations[1]: a toleration without a key and operator Exists")
    assert "operator.policy.allowTolerateAll" in line


def test_an_allow_list_is_exact_and_the_operators_own_gpu_toleration_stays_allowed() -> None:
    policy = SchedulingPolicy(
        priority_classes=("training-low",), toleration_keys=("dedicated",), tolerate_everything=True
    )
    ok = _spec(
        priorityClassName="training-low",
        tolerations=[
            {"key": "dedicated", "operator": "Exists"},
            {"key": "nvidia.com/gpu", "operator": "Exists"},
            EVERYTHING,
        ],
    )
    assert policy.problems(ok) == []
    lines = policy.problems(
        _spec(priorityClassName="training-high", tolerations=[{"key": "node-role.kubernetes.io/control-plane"}])
    )
    assert lines == [
        "spec.resources.priorityClassName: 'training-high' is not allowed by this installation "
        "(allowed: training-low; chart value operator.policy.allowedPriorityClasses)",
        "spec.resources.tolerations[0]: key 'node-role.kubernetes.io/control-plane' is not allowed "
        "by this installation "
        "(allowed: dedicated, nvidia.com/gpu; chart value operator.policy.allowedTolerationKeys)",
    ]


def test_the_pod_template_is_held_to_the_same_policy() -> None:
    spec = make_job(podTemplate={"priorityClassName": "system-cluster-critical", "tolerations": [EVERYTHING]}).spec
    fields = [line.split(":")[0] for line in SchedulingPolicy().problems(spec)]
    assert fields == ["spec.podTemplate.priorityClassName", "spec.podTemplate.tolerations[0]"]


@pytest.mark.parametrize("policy", [SchedulingPolicy(), SchedulingPolicy(priority_classes=("training",))])
def test_the_operator_fails_such_a_job_as_invalid_before_planning(policy: SchedulingPolicy) -> None:
    with pytest.raises(PlanFailed) as failed:
        plan_or_fail(_spec(priorityClassName="system-node-critical"), None, policy)
    assert failed.value.reason == "InvalidSpec" and "spec.resources.priorityClassName" in str(failed.value)
    assert plan_or_fail(_spec(), None, policy).zero_stage in (0, 1, 2, 3)


TOKEN_VOLUME = {
    "name": "vault-token",
    "projected": {"sources": [{"configMap": {"name": "ca"}}, {"serviceAccountToken": {"path": "token"}}]},
}


def test_a_projected_service_account_token_is_refused_unless_the_installation_allows_it() -> None:
    spec = make_job(
        objectStorage={"serviceAccountName": "trainer"},
        podTemplate={"volumes": [{"name": "scratch2", "emptyDir": {}}, TOKEN_VOLUME],
                     "volumeMounts": [{"name": "vault-token", "mountPath": "/var/run/vault"}]},
    ).spec  # fmt: skip
    (line,) = SchedulingPolicy().problems(spec)
    assert line.startswith("spec.podTemplate.volumes[1].projected.sources[1].serviceAccountToken: ")
    assert "apiserver token" in line and "operator.policy.allowServiceAccountTokenVolumes" in line
    with pytest.raises(PlanFailed) as failed:
        plan_or_fail(spec, None, SchedulingPolicy())
    assert failed.value.reason == "InvalidSpec" and "serviceAccountToken" in str(failed.value)
    assert SchedulingPolicy(token_volumes=True).problems(spec) == []


def _projected(name: str, *sources: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "projected": {"sources": list(sources)}}


TOKEN = {"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 3600}}


@pytest.mark.parametrize(
    ("volumes", "refused"),
    [
        ([_projected("t", TOKEN)], ["volumes[0].projected.sources[0]"]),
        ([_projected("a", {"configMap": {"name": "c"}}), _projected("t", {"secret": {"name": "s"}}, TOKEN)],
         ["volumes[1].projected.sources[1]"]),
        ([_projected("t", TOKEN, TOKEN)], ["volumes[0].projected.sources[0]", "volumes[0].projected.sources[1]"]),
        ([_projected("t", {"serviceAccountToken": {}})], ["volumes[0].projected.sources[0]"]),
        ([_projected("a", {"downwardAPI": {"items": []}}, {"configMap": {"name": "c"}})], []),
        ([{"name": "e", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}], []),
    ],
)  # fmt: skip
def test_every_projected_token_source_is_found(volumes: list[dict[str, Any]], refused: list[str]) -> None:
    spec = make_job(podTemplate={"volumes": volumes}).spec
    lines = SchedulingPolicy().problems(spec)
    assert [line.split(":")[0] for line in lines] == [f"spec.podTemplate.{r}.serviceAccountToken" for r in refused]
    assert SchedulingPolicy(token_volumes=True).problems(spec) == []
