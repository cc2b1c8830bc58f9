"""The serving objects of a job, as the operator applies them after success.

They are not owned by the job (deleting the job leaves them serving) and carry the
`finetune.dev/served-job` label, never the `finetune.dev/job-name` label the operator's
watches select the job's own children by: a serving pod is not a rank. The annotation
`finetune.dev/served-job-uid` says which job may update them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ...api.job import FineTuneJob
from ...api.serving import ServedObject, ServingStatus, ServingTarget
from ...api.status import Result
from . import deployment, kserve
from .choice import Choice, Refused, choose, target_refusal

SERVED_JOB_LABEL = "finetune.dev/served-job"
SERVED_JOB_UID_ANNOTATION = "finetune.dev/served-job-uid"
SERVING_HASH_ANNOTATION = "finetune.dev/serving-hash"


@dataclass(frozen=True)
class Served:
    choice: Choice
    objects: list[dict[str, Any]]
    status: ServingStatus


def served_labels(job: FineTuneJob) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "finetune-serving",
        "app.kubernetes.io/instance": job.spec.serving.name or job.name if job.spec.serving else job.name,
        "app.kubernetes.io/managed-by": "finetune-operator",
        SERVED_JOB_LABEL: job.name,
    }


def serving_hash(job: FineTuneJob, result: Result | None) -> str:
    """What the served objects follow: the serving spec and the result URIs."""
    spec = job.spec.serving.model_dump_json() if job.spec.serving else ""
    uris = [result.adapter_uri, result.merged_model_uri, result.model_uri] if result else []
    return hashlib.sha256(json.dumps([spec, uris, job.spec.model.uri]).encode()).hexdigest()[:16]


def render_serving(job: FineTuneJob, result: Result | None = None) -> Served | Refused:
    """The objects that serve `job`'s result (`result`: its status.result; default: the predicted URIs)."""
    choice = choose(job, result)
    if isinstance(choice, Refused):
        return choice
    if (refused := target_refusal(choice)) is not None:
        return refused
    digest = serving_hash(job, result)
    meta = {
        "name": choice.name,
        "namespace": job.namespace,
        "labels": served_labels(job),
        "annotations": {SERVED_JOB_UID_ANNOTATION: job.metadata.uid or "", SERVING_HASH_ANNOTATION: digest},
    }
    target = choice.spec.target
    if target == ServingTarget.INFERENCE_SERVICE:
        objects, url = [kserve.inference_service(choice, meta)], kserve.inference_service_url(choice, job.namespace)
    elif target == ServingTarget.LLM_INFERENCE_SERVICE:
        objects, url = [kserve.llm_inference_service(choice, meta)], None
    else:
        objects = deployment.vllm_objects(choice, meta)
        url = deployment.service_url(choice, job.namespace)
    status = ServingStatus(
        objects=[ServedObject(kind=o["kind"], name=o["metadata"]["name"]) for o in objects],
        served=choice.artifact,
        model_name=choice.served_model_name,
        url=url,
        spec_hash=digest,
    )
    return Served(choice, objects, status)
