"""What an installation lets a job ask of the scheduler and the kubelet: priority classes,
tolerations and service-account tokens.

A FineTuneJob's author is not the cluster's admin. `system-node-critical` would let a
training pod preempt kube-proxy or a CNI agent, and a toleration with no key and
`operator: Exists` lets it run on every tainted node (control plane, nodes being drained,
another team's reserved pool). The chart sets the policy (`operator.policy.*` values, the
operator's `--allowed-priority-class`, `--allowed-toleration-key` and `--allow-tolerate-all`
flags); a job outside it is `Failed/InvalidSpec` before any pod exists, naming the field and
what is allowed.

Trainer pods get no apiserver token. A projected `serviceAccountToken` volume in
`spec.podTemplate` would give them one for a service account of the namespace (with
`objectStorage.serviceAccountName`, the one the job names), so it is refused unless the chart
allows it (`operator.policy.allowServiceAccountTokenVolumes`, `--allow-service-account-token-volumes`),
e.g. for Vault or SPIFFE authentication with an audience of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune_operator.api.pod_template import token_volume_fields
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.toleration import Toleration
from finetune_operator.plan.errors import PlanningError

OPERATOR_TOLERATION_KEYS = ("nvidia.com/gpu",)
"""Tolerations the operator adds itself to GPU pods: always allowed."""


class PolicyViolationError(PlanningError):
    """The job asks for a priority class or toleration this installation does not allow."""


@dataclass(frozen=True)
class SchedulingPolicy:
    """Empty `priority_classes`: any class but `system-*`; empty `toleration_keys`: any key."""

    priority_classes: tuple[str, ...] = ()
    toleration_keys: tuple[str, ...] = ()
    tolerate_everything: bool = False
    token_volumes: bool = False

    def problems(self, spec: FineTuneJobSpec) -> list[str]:
        out: list[str] = []
        overlay = spec.pod_template
        for field, name in (
            ("spec.resources.priorityClassName", spec.resources.priority_class_name),
            ("spec.podTemplate.priorityClassName", overlay.priority_class_name if overlay else None),
        ):
            if name is not None and not self._priority_allowed(name):
                out.append(f"{field}: {name!r} is not allowed by this installation ({self._priority_rule()})")
        for field, tolerations in (
            ("spec.resources.tolerations", spec.resources.tolerations),
            ("spec.podTemplate.tolerations", overlay.tolerations if overlay else None),
        ):
            for index, toleration in enumerate(tolerations or []):
                problem = self._toleration_problem(toleration)
                if problem:
                    out.append(f"{field}[{index}]: {problem}")
        if not self.token_volumes:
            out.extend(
                f"{field}: a projected service-account token would give the trainer pods an apiserver token, which "
                "this installation does not allow (chart value operator.policy.allowServiceAccountTokenVolumes)"
                for field in token_volume_fields(overlay)
            )
        return out

    def check(self, spec: FineTuneJobSpec) -> None:
        found = self.problems(spec)
        if found:
            raise PolicyViolationError("; ".join(found))

    def _priority_allowed(self, name: str) -> bool:
        if self.priority_classes:
            return name in self.priority_classes
        return not name.startswith("system-")

    def _priority_rule(self) -> str:
        if self.priority_classes:
            return f"allowed: {', '.join(self.priority_classes)}; chart value operator.policy.allowedPriorityClasses"
        return "system-* classes are for cluster components; chart value operator.policy.allowedPriorityClasses"

    def _toleration_problem(self, toleration: Toleration) -> str | None:
        if not toleration.key:
            if toleration.operator == "Exists" and not self.tolerate_everything:
                return (
                    "a toleration without a key and operator Exists tolerates every taint, which this installation "
                    "does not allow (chart value operator.policy.allowTolerateAll); name the taint's key"
                )
            return None
        if self.toleration_keys and toleration.key not in (*self.toleration_keys, *OPERATOR_TOLERATION_KEYS):
            allowed = ", ".join((*self.toleration_keys, *OPERATOR_TOLERATION_KEYS))
            return (
                f"key {toleration.key!r} is not allowed by this installation (allowed: {allowed}; "
                "chart value operator.policy.allowedTolerationKeys)"
            )
        return None
