"""The trainer container's env entries, built only from the declared names (`api.pod_env`).

A renderer cannot write a name the pod contract does not declare: every builder here takes a
`PodEnv`, and the entry carries its plain string (what the apiserver and YAML output expect).
"""

from __future__ import annotations

from typing import Any

from ..api.pod_env import PodEnv


def value_entry(name: PodEnv, value: str) -> dict[str, Any]:
    return {"name": name.value, "value": value}


def field_entry(name: PodEnv, path: str) -> dict[str, Any]:
    """The pod's own field (`metadata.name`, `status.podIP`, ...) through the downward API."""
    return {"name": name.value, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def secret_entry(name: PodEnv, secret: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    """A Secret's key through `secretKeyRef`; `optional` leaves the variable unset when either is missing."""
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name.value, "valueFrom": {"secretKeyRef": ref}}
