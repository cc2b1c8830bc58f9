"""Running, or waiting for workers: every rank of the gang ready is `Running` (and the end of a
restart, announced), and so is a gang whose finished ranks wait for the rest; anything less
says how many are ready and why the first stuck one waits
(unschedulable, a container waiting: ImagePullBackOff, CreateContainerConfigError, ..., or a
Warning Event about the pod: FailedAttachVolume, FailedMount, ...). A pod the scheduler cannot
place because no node carries the GPU label it requires also says how to place by another label,
or by the device plugin's resource alone. It decides every gang the other worker policies leave."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...render.placement import placement_hint
from ..conditions import is_true
from ..observed import PodView
from .phases import Action, Gang
from .status_builder import StatusBuilder


def _unschedulable(pod: PodView) -> str | None:
    """The scheduler's reason, with what to do when the pod's GPU label matched no node."""
    said = pod.unschedulable
    if said and pod.gpu_label and ("affinity" in said or "selector" in said):
        return f"{said} ({placement_hint(pod.gpu_label)})"
    return said


def decide(gang: Gang, b: StatusBuilder) -> Action:
    nodes, ready, pods = gang.nodes, gang.ready, gang.pods
    # A rank that exited 0 while its peers still train is finishing, not waiting: the job
    # stays Running (it never goes back to Planned on its way to Succeeded).
    finished = sum(1 for p in pods if p.failure is None and p.completed is not None and not p.ready)
    if finished and len(pods) == nodes and ready + finished == nodes:
        message = f"{finished} of {nodes} workers finished, {ready} still running"
        b.cond(ConditionType.RUNNING, True, R.FINISHING, message)
    elif len(pods) == nodes and ready == nodes:
        b.cond(ConditionType.RUNNING, True, R.ALL_RUNNING, f"{nodes} of {nodes} workers running")
        if is_true(b.status.conditions, ConditionType.RESTARTING):
            b.cond(ConditionType.RESTARTING, False, R.RECOVERED, "all ranks are back", announce=True)
    else:
        why = ((p.name, _unschedulable(p) or p.waiting or p.warning) for p in pods)
        stuck = next((f"; {name}: {reason}" for name, reason in why if reason), "")
        b.cond(ConditionType.RUNNING, False, R.WAITING, f"{ready} of {nodes} workers ready{stuck}")
    return gang.keep()
