"""The short-lived pod that reads a model's config.json where the operator cannot, and the record of it.

The operator never mounts a claim and never reads a Secret. So a model on a claim, or a hub
model that needs the job's token, is read by a pod in the job's namespace, owned by the job:
`ftjob inspect-model` (in the trainer image, whose transformers also says whether it knows the
model_type) reads config.json and the sizes of the weight files, and hands them back as its
termination message (`api.model_inspection`), then exits. It mounts the claim read-only, gets the
token only through `secretKeyRef`, runs as non-root under the restricted Pod Security Standard
with no service-account token and a read-only root file system, and receives every user string
as an argv element. It requests no GPU and lands where the job's pods may (their node selector and
tolerations), so a claim that only those nodes can attach is readable.

What was read is kept in a ConfigMap the job owns (`<job>-model`: config.json and where it came
from), so a re-plan after an out-of-memory error, or an operator restart, plans with the same
config without reading the model again; `kubectl get cm <job>-model` shows what the plan counted.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..api.job import FineTuneJob
from ..api.model_inspection import ModelInspection
from ..api.model_uri import claim_model, hub_model
from ..api.pod_contract import TERMINATION_LOG
from ..api.storage_uri import PVC_ROOT
from .identity import metadata
from .options import RenderOptions
from .placement import node_selector, tolerations
from .volumes import claim_volume_name

REQUEST_ANNOTATION = "finetune.dev/model-request"
"""The hash of what a pod inspects or a record holds (uri, revision, token reference): a spec
change makes an older one stale."""
ACTIVE_DEADLINE_SECONDS = 600
"""A pod stuck reading (a hung mount, a stalled hub) is stopped by the kubelet and read as failed."""
RECORD_CONFIG = "config.json"
RECORD_SOURCE = "source.json"


def inspector_pod_name(job_name: str) -> str:
    return f"{job_name}-model-inspector"


def inspector_name(job: FineTuneJob) -> str:
    return inspector_pod_name(job.name)


def record_name(job: FineTuneJob) -> str:
    return f"{job.name}-model"


def model_request(job: FineTuneJob) -> str:
    """What is read, as a short hash: a record or a pod for another request is stale."""
    model, token = job.spec.model, job.spec.hf_token_secret_ref
    key = [model.uri, model.revision, token.name if token else None, token.key if token else None]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def _restricted() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def inspector_pod(job: FineTuneJob, options: RenderOptions) -> dict[str, Any]:
    """The inspector of the job's model (a claim folder, or a hub id read with the job's token)."""
    spec = job.spec
    args = ["inspect-model", "--output", TERMINATION_LOG]
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/hf"},
                                 {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]  # fmt: skip
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    claim = claim_model(spec.model.uri)
    hub = hub_model(spec.model.uri, spec.model.revision)
    if claim is not None:
        volume = claim_volume_name(claim.claim)
        volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim.claim, "readOnly": True}})
        mounts.append({"name": volume, "mountPath": f"{PVC_ROOT}/{claim.claim}", "readOnly": True})
        folder = f"{PVC_ROOT}/{claim.claim}" + (f"/{claim.path}" if claim.path else "")
        args += ["--folder", folder, "--origin", str(claim)]
    elif hub is not None:
        args += ["--hub", hub.repo]
        if hub.revision:
            args += ["--revision", hub.revision]
        if options.hub_endpoint:
            env.append({"name": "HF_ENDPOINT", "value": options.hub_endpoint})
        ref = spec.hf_token_secret_ref
        if ref is not None:
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
            args += ["--token-source", f"spec.hfTokenSecretRef ({ref.name}/{ref.key})"]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": options.run_as_user,
            "runAsGroup": options.run_as_user,
            "fsGroup": options.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "inspector",
                "image": spec.image or options.trainer_image,
                "imagePullPolicy": options.image_pull_policy,
                "command": ["ftjob"],
                "args": args,
                "env": env,
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
                "volumeMounts": mounts,
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": _restricted(),
            }
        ],
        "volumes": volumes,
    }
    if selector := node_selector(job):
        pod_spec["nodeSelector"] = selector
    if tolerated := tolerations(job):
        pod_spec["tolerations"] = tolerated
    overlay = spec.pod_template
    if overlay is not None and overlay.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in overlay.image_pull_secrets]
    meta = metadata(job, inspector_name(job), "model-inspector")
    meta["annotations"] = {REQUEST_ANNOTATION: model_request(job)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def model_record(job: FineTuneJob, inspection: ModelInspection) -> dict[str, Any]:
    """The ConfigMap keeping what was read: the config.json the plan counts and where it came from."""
    meta = metadata(job, record_name(job), "model")
    meta["annotations"] = {REQUEST_ANNOTATION: model_request(job)}
    source = {"origin": inspection.origin, "commit": inspection.commit, "weightBytes": inspection.weight_bytes}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {
            RECORD_CONFIG: json.dumps(inspection.config, indent=1, sort_keys=True),
            RECORD_SOURCE: json.dumps(source, sort_keys=True),
        },
    }


def read_record(job: FineTuneJob, body: dict[str, Any] | None) -> ModelInspection | None:
    """What a `<job>-model` ConfigMap holds for this job's current model, None if absent or stale."""
    if not body or ((body.get("metadata") or {}).get("annotations") or {}).get(REQUEST_ANNOTATION) != model_request(
        job
    ):
        return None
    data = body.get("data") or {}
    try:
        config = json.loads(data[RECORD_CONFIG])
        source = json.loads(data[RECORD_SOURCE])
        return ModelInspection(
            origin=str(source["origin"]), config=config, weight_bytes=source.get("weightBytes"),
            commit=source.get("commit"),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None
