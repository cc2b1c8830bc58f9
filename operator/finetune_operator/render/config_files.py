"""The files every trainer pod reads from its config directory.

The operator ships them in a ConfigMap mounted at `/etc/ftjob`; `ftjob run` writes
the same files to a temporary directory. Either way `ftjob train --config DIR` sees
one layout: the job, the plan, the DeepSpeed config and the hostfile.
"""

from __future__ import annotations

import json

from ..api.job import FineTuneJob
from ..api.pod_contract import CONFIG_DIR, DEEPSPEED_FILE, HOSTFILE, JOB_FILE, PLAN_FILE
from ..api.status import PlanStatus
from .deepspeed_config import deepspeed_config

__all__ = [
    "CONFIG_DIR",
    "DEEPSPEED_FILE",
    "HOSTFILE",
    "JOB_FILE",
    "PLAN_FILE",
    "cluster_hostfile",
    "config_files",
    "rank_host",
    "workers_service_name",
]


def workers_service_name(job: FineTuneJob) -> str:
    return f"{job.name}-workers"


def rank_host(job: FineTuneJob, ordinal: int) -> str:
    """The stable DNS name of a StatefulSet pod behind the headless Service."""
    return f"{job.name}-{ordinal}.{workers_service_name(job)}.{job.namespace}.svc"


def cluster_hostfile(job: FineTuneJob) -> str:
    """One `<host> slots=<ranks>` line per pod, in ordinal order."""
    slots = job.spec.resources.ranks_per_node
    return "".join(f"{rank_host(job, i)} slots={slots}\n" for i in range(job.spec.resources.num_nodes))


def _json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def config_files(job: FineTuneJob, plan: PlanStatus, hostfile: str | None = None) -> dict[str, str]:
    """File name → content for the config directory (a pure function)."""
    stable = {"name": job.name, "namespace": job.namespace}  # never uid/resourceVersion: they would roll the gang
    # spec.serving is the operator's, after training: changing it must not restart the gang
    spec = job.spec.model_copy(update={"serving": None})
    spec_only = job.model_copy(update={"status": None, "metadata": job.metadata.model_validate(stable), "spec": spec})
    return {
        JOB_FILE: _json(spec_only.to_wire()),
        PLAN_FILE: _json(plan.to_wire()),
        DEEPSPEED_FILE: _json(deepspeed_config(job.spec, plan)),
        HOSTFILE: hostfile if hostfile is not None else cluster_hostfile(job),
    }
