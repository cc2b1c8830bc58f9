"""GPU placement, the model cache, the podTemplate overlay and small pod fields (issue 13).

Each test fails on the renderer before issue 13: no node affinity on GPU Feature Discovery's
`nvidia.com/gpu.memory`, no default `nvidia.com/gpu` toleration, the model downloaded into the
container layer, no `spec.podTemplate`, no OMP_NUM_THREADS, no fsGroupChangePolicy.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from finetune_operator.api import FineTuneJob
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.render.manifests import render_all
from finetune_operator.render.options import GpuPlacement, RenderOptions
from finetune_operator.render.workers import NCCL_ENV
from tests.factories import job_document

OPTIONS = RenderOptions(trainer_image="trainer:test")


def job(**spec: Any) -> FineTuneJob:
    resources = {"numNodes": 2, "gpusPerNode": 8, **spec.pop("resources", {})}
    return FineTuneJob.from_manifest(job_document(resources=resources, **spec))


def template(j: FineTuneJob) -> dict[str, Any]:
    sts = next(o for o in render_all(j, fixed_plan(j.spec), OPTIONS, 2) if o["kind"] == "StatefulSet")
    t: dict[str, Any] = sts["spec"]["template"]
    return t


def env_of(t: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in t["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(("memory", "floor"), [("80Gi", 76185), ("24Gi", 22855), ("141Gi", 134277)])
def test_gpu_memory_becomes_a_node_requirement_on_the_gfd_label(memory: str, floor: int) -> None:
    terms = template(job(resources={"gpuMemory": memory}))["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(floor)]}]}]


def _required(j: FineTuneJob, placement: GpuPlacement) -> Any:
    objects = render_all(j, fixed_plan(j.spec), RenderOptions(gpu_placement=placement), 2)
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    return sts["spec"]["template"]["spec"].get("affinity")


def test_product_placement_requires_the_known_products_with_that_memory() -> None:
    terms = _required(job(resources={"gpuMemory": "80Gi"}), GpuPlacement.PRODUCT)["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 1 and len(terms[0]["matchExpressions"]) == 1
    expression = terms[0]["matchExpressions"][0]
    assert (expression["key"], expression["operator"]) == ("nvidia.com/gpu.product", "In")
    assert {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H200"} <= set(expression["values"])
    assert not {"NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "Tesla-T4"} & set(expression["values"])


def test_product_placement_of_a_gpu_larger_than_any_known_waits_instead_of_landing_on_a_smaller_one() -> None:
    expression = _required(job(resources={"gpuMemory": "400Gi"}), GpuPlacement.PRODUCT)["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression["values"] == ["none-known-with-400Gi"]


def test_resource_placement_requires_no_gpu_label() -> None:
    """Without GPU Feature Discovery no node has its labels: the device plugin's resource alone places
    the pods (they used to stay Pending forever); the toleration and a user's own affinity stay."""
    bare = job(resources={"gpuMemory": "80Gi"})
    assert _required(bare, GpuPlacement.RESOURCE) is None
    spec = template(bare)["spec"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    pool = {"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-h100-80gb"]}
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [pool]}
    ]}}}  # fmt: skip
    assert _required(job(podTemplate={"affinity": user}), GpuPlacement.RESOURCE) == user


def test_h100_and_l4_labels_pass_their_nominal_size() -> None:
    """GFD reports less than the nominal size: H100 80GB 81559 MiB, L4 23034 MiB for 24Gi."""
    for memory, label in (("80Gi", 81559), ("24Gi", 23034)):
        expression = template(job(resources={"gpuMemory": memory}))["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert label > int(expression["values"][0])


def test_user_affinity_terms_each_get_the_gpu_requirement() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    spec = template(job(podTemplate={"affinity": user}))["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [[e["key"] for e in t["matchExpressions"]] for t in terms] == [["zone", "nvidia.com/gpu.memory"]] * 2
    assert "podAntiAffinity" in spec["affinity"]


def test_cpu_jobs_have_no_gpu_placement() -> None:
    spec = template(job(resources={"gpusPerNode": 0}))["spec"]
    assert "affinity" not in spec and "tolerations" not in spec


def test_gpu_jobs_tolerate_the_nvidia_taint_once() -> None:
    assert template(job())["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    same = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert len(template(job(resources={"tolerations": [same]}))["spec"]["tolerations"]) == 1


def statefulset(j: FineTuneJob, model_bytes: int | None = None, options: RenderOptions | None = None) -> Any:
    plan = fixed_plan(j.spec).model_copy(update={"model_bytes": model_bytes})
    return next(o for o in render_all(j, plan, options or RenderOptions(), 2) if o["kind"] == "StatefulSet")


def test_hub_model_gets_a_claim_per_pod_that_outlives_gang_restarts_and_prefetch() -> None:
    sts = statefulset(job(model={"uri": "meta-llama/Llama-3.1-8B", "cache": {"size": "40Gi"}}))
    (cache,) = sts["spec"]["volumeClaimTemplates"]
    assert cache["metadata"]["name"] == "model-cache"
    assert cache["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "40Gi"}}}
    # pods are deleted by a gang restart and the claims kept; deleting the job deletes them
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    t = sts["spec"]["template"]
    assert "model-cache" not in {v["name"] for v in t["spec"]["volumes"]}  # the template provides it
    c = t["spec"]["containers"][0]
    assert "ephemeral-storage" not in c["resources"].get("requests", {})
    assert {"name": "model-cache", "mountPath": "/var/cache/ftjob"} in c["volumeMounts"]
    env = env_of(t)
    assert env["HF_HOME"] == "/var/cache/ftjob/hf" and env["FTJOB_PREFETCH_MODEL"] == "1"
    assert env["FTJOB_DOWNLOAD_TIMEOUT_SECONDS"] == "7200" and "HF_ENDPOINT" not in env


def test_the_cache_claim_is_sized_from_the_models_files_with_the_storage_class() -> None:
    seventy_b = 141_107_412_992  # Llama-3.1-70B's safetensors, bf16
    options = RenderOptions(model_cache_storage_class="fast-ssd", hub_endpoint="http://mirror.local")
    sts = statefulset(job(model={"uri": "meta-llama/Llama-3.1-70B"}), seventy_b, options)
    spec = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert spec["resources"]["requests"]["storage"] == "160Gi" and spec["storageClassName"] == "fast-ssd"
    assert env_of(sts["spec"]["template"])["HF_ENDPOINT"] == "http://mirror.local"
    own = job(model={"uri": "meta-llama/Llama-3.1-70B", "cache": {"storageClassName": "nvme-local"}})
    assert statefulset(own, seventy_b, options)["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == (
        "nvme-local"
    )


def test_cache_claim_replaces_the_claim_per_pod() -> None:
    sts = statefulset(job(model={"uri": "hf://meta-llama/Llama-3.1-8B", "cache": {"claimName": "hf-cache"}}))
    t = sts["spec"]["template"]
    volumes = {v["name"]: v for v in t["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "ephemeral-storage" not in t["spec"]["containers"][0]["resources"].get("requests", {})


def test_pvc_model_needs_no_cache() -> None:
    t = template(job(model={"uri": "pvc://models/llama"}))
    assert "model-cache" not in {v["name"] for v in t["spec"]["volumes"]}
    assert "FTJOB_PREFETCH_MODEL" not in env_of(t)
    assert "volumeClaimTemplates" not in statefulset(job(model={"uri": "pvc://models/llama"}))["spec"]


OVERLAY = {
    "metadata": {
        "labels": {"team": "ml"},
        "annotations": {"k8s.v1.cni.cncf.io/networks": "ib-sriov"},
    },
    "tolerations": [{"key": "rdma", "operator": "Exists"}],
    "nodeSelector": {"network": "ib"},
    "resources": {"rdma/ib": 1, "nvidia.com/hostdev": "8"},
    "volumes": [{"name": "scratch", "hostPath": {"path": "/scratch"}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "runtimeClassName": "nvidia",
    "schedulerName": "volcano",
    "priorityClassName": "training",
    "imagePullSecrets": [{"name": "regcred"}],
    "capabilities": {"add": ["IPC_LOCK"]},
}


def test_overlay_fields_reach_the_pod_under_the_operator_fields() -> None:
    t = template(job(podTemplate=OVERLAY))
    assert t["metadata"]["labels"]["team"] == "ml"
    assert t["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert t["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-sriov"
    assert "finetune.dev/config-hash" in t["metadata"]["annotations"]
    spec = t["spec"]
    assert {"key": "rdma", "operator": "Exists"} in spec["tolerations"]
    assert spec["nodeSelector"] == {"network": "ib"}
    c = spec["containers"][0]
    assert c["resources"]["limits"]["rdma/ib"] == "1" and c["resources"]["requests"]["nvidia.com/hostdev"] == "8"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"name": "scratch", "hostPath": {"path": "/scratch"}} in spec["volumes"]
    assert {"name": "scratch", "mountPath": "/scratch"} in c["volumeMounts"]
    assert (spec["runtimeClassName"], spec["schedulerName"], spec["priorityClassName"]) == (
        "nvidia",
        "volcano",
        "training",
    )
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize(
    ("overlay", "says"),
    [
        ({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}, "owned by the operator"),
        ({"metadata": {"annotations": {"finetune.dev/config-hash": "x"}}}, "owned by the operator"),
        ({"resources": {"nvidia.com/gpu": 4}}, "set it there"),
        ({"resources": {"memory": "1Gi"}}, "set it there"),
        ({"volumes": [{"name": "config", "emptyDir": {}}]}, "owned by the operator"),
        ({"volumes": [{"name": "pvc-data", "emptyDir": {}}]}, "owned by the operator"),
        ({"volumes": [{"emptyDir": {}}]}, "needs a name"),
        (
            {"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/etc/ftjob"}]},
            "overlaps a path the operator mounts",
        ),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/data"}]}, "not one of podTemplate.volumes"),
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, "capabilities"),
        ({"hostNetwork": True}, "hostNetwork"),
    ],
)
def test_overlay_cannot_override_operator_fields(overlay: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        job(podTemplate=overlay)
    assert says in str(err.value), str(err.value)
    assert "podTemplate" in str(err.value) or "pod_template" in str(err.value)


def test_priority_class_in_two_places_is_refused() -> None:
    with pytest.raises(ValidationError, match="priorityClassName in one place"):
        job(resources={"priorityClassName": "a"}, podTemplate={"priorityClassName": "b"})


def test_omp_threads_follow_the_cpu_limit() -> None:
    """With `resources.cpu` the renderer divides it among the pod's ranks (OpenMP's and MKL's pools);
    without it the node launcher divides the CPUs the pod may use (`rank_threads.share`)."""
    threads = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    assert [env_of(template(job(resources={"cpu": "64"})))[k] for k in threads] == ["8", "8"]
    assert [env_of(template(job(resources={"cpu": "4", "gpusPerNode": 8})))[k] for k in threads] == ["1", "1"]
    assert not set(threads) & set(env_of(template(job())))
    user = [{"name": "OMP_NUM_THREADS", "value": "3"}]
    assert env_of(template(job(resources={"cpu": "64"}, env=user)))["OMP_NUM_THREADS"] == "3"


def test_gpu_pods_abort_a_timed_out_collective_with_a_trace() -> None:
    """NCCL's watchdog ends a rank stuck past the collective timeout (SIGABRT), says why in the log
    and dumps its flight recorder; a user's entry wins. CPU pods (gloo) get none of it."""
    gpu = env_of(template(job(resources={"gpusPerNode": 8})))
    assert {k: gpu[k] for k in NCCL_ENV} == {
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    assert not set(NCCL_ENV) & set(env_of(template(job(resources={"gpusPerNode": 0}))))
    user = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    assert env_of(template(job(resources={"gpusPerNode": 8}, env=user)))["NCCL_DEBUG"] == "INFO"


def test_fs_group_is_applied_only_on_root_mismatch() -> None:
    assert template(job())["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
