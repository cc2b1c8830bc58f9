"""A worker runs an older configuration (a spec edit, a re-plan): restart every rank together
on the new one, from the last checkpoint (pods are never updated in place: `OnDelete`)."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from .phases import Action, Gang
from .status_builder import StatusBuilder


def decide(gang: Gang, b: StatusBuilder) -> Action | None:
    if not gang.pods:
        return None
    desired = gang.inputs.desired_config_hash(gang.plan)
    if all(p.config_hash == desired for p in gang.pods):
        return None
    b.cond(ConditionType.RESTARTING, True, R.CONFIG_CHANGED, "configuration changed: restarting all ranks")
    b.cond(ConditionType.RUNNING, False, R.CONFIG_CHANGED, "")
    return gang.restart(gang.plan)
