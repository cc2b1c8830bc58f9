"""The status write is a JSON merge patch: what it leaves out of a nested object would stay."""

from __future__ import annotations

from typing import Any

from finetune_operator.reconcile.cluster_io import status_patch


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the apiserver applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def test_keys_removed_at_any_depth_are_removed_by_the_patch() -> None:
    old = {
        "state": "Running",
        "progress": {"step": 3, "etaSeconds": 10},
        "result": {"tracking": {"runId": "abc", "failing": True, "reason": "HTTP 503"}},
        "conditions": [{"type": "Running"}, {"type": "Planned"}],
    }
    new = {
        "state": "Succeeded",
        "result": {"steps": 8, "tracking": {"runId": "abc"}},
        "conditions": [{"type": "Succeeded"}],
    }
    assert merge(old, status_patch(old, new)) == new
    assert merge({}, status_patch(None, new)) == new
