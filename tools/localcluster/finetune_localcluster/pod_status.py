"""The status a process node reports for a pod: phase, conditions and container states, the way
a kubelet shows them (a pending restart as CrashLoopBackOff, a setup problem as ContainerCreating)."""

from __future__ import annotations

from finetune_localcluster.kube import Obj
from finetune_localcluster.pod_runs import Container, PodRun, now


def _cond(run: PodRun, kind: str, ok: bool) -> Obj:
    status = "True" if ok else "False"
    if run.cond_times.get(kind, ("", ""))[0] != status:
        run.cond_times[kind] = (status, now())
    return {"type": kind, "status": status, "lastTransitionTime": run.cond_times[kind][1]}


def _ctr_status(run: PodRun, c: Container) -> Obj:
    state, last = c.state, c.last_state
    if run.error and "waiting" in state:
        state = {"waiting": {"reason": "ContainerCreating", "message": run.error}}
    elif "terminated" in state and not c.done:  # restart pending: back-off, as a kubelet shows it
        state, last = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting {c.name}"}}, state
    return {
        "name": c.name,
        "image": c.spec.get("image", ""),
        "imageID": "",
        "ready": c.ready,
        "started": "running" in state,
        "restartCount": c.restarts,
        "state": state,
        "lastState": last,
    }


def pod_status(run: PodRun) -> Obj:
    """The pod's status as a kubelet would report it: phase, conditions, IPs, container states."""
    inits_ok = all(c.done and c.state["terminated"]["exitCode"] == 0 for c in run.inits)
    init_failed = any(c.done and c.state["terminated"]["exitCode"] != 0 for c in run.inits)
    if init_failed or (run.ctrs and all(c.done for c in run.ctrs)):
        bad = init_failed or any(c.state["terminated"]["exitCode"] != 0 for c in run.ctrs)
        phase = "Failed" if bad else "Succeeded"
    else:
        phase = "Running" if inits_ok and any(c.started_at for c in run.ctrs) else "Pending"
    ready = phase == "Running" and all(c.ready for c in run.ctrs)
    conditions = [
        _cond(run, "PodReadyToStartContainers", run.prepared),
        _cond(run, "Initialized", inits_ok),
        _cond(run, "ContainersReady", ready),
        _cond(run, "Ready", ready),
        _cond(run, "PodScheduled", True),
    ]
    status = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": run.ip,
        "podIPs": [{"ip": run.ip}],
        "startTime": run.start_time,
        "containerStatuses": [_ctr_status(run, c) for c in run.ctrs],
        "initContainerStatuses": [_ctr_status(run, c) for c in run.inits],
    }
    return status
