"""The pure renderers: deterministic manifests that satisfy the pod contract."""

from __future__ import annotations

import json
from typing import Any

import pytest

from finetune_operator.api import FineTuneJob
from finetune_operator.api.status import PlanStatus
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.render.config_files import cluster_hostfile
from finetune_operator.render.deepspeed_config import deepspeed_config
from finetune_operator.render.manifests import config_hash, config_map, gang_hash, render_all
from finetune_operator.render.options import RenderOptions
from tests.factories import job_document

OPTIONS = RenderOptions(trainer_image="trainer:test")


def job(uid: str | None = "u-1", **spec: Any) -> FineTuneJob:
    resources = {"numNodes": 2, "gpusPerNode": 8, **spec.pop("resources", {})}
    doc = job_document(resources=resources, **spec)
    if uid:
        doc["metadata"]["uid"] = uid
    return FineTuneJob.from_manifest(doc)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def rendered(j: FineTuneJob, options: RenderOptions = OPTIONS, replicas: int = 2) -> dict[str, dict[str, Any]]:
    return by_kind(render_all(j, fixed_plan(j.spec), options, replicas))


def container(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = objs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    return c


def test_rendering_is_deterministic() -> None:
    j = job()
    assert render_all(j, fixed_plan(j.spec), OPTIONS, 2) == render_all(j, fixed_plan(j.spec), OPTIONS, 2)


def test_the_gang_hash_is_the_one_the_rendered_pods_carry() -> None:
    j = job()
    plan = fixed_plan(j.spec)
    gang = gang_hash(j, plan, OPTIONS)
    sts = by_kind(render_all(j, plan, OPTIONS, 2))["StatefulSet"]
    assert gang in json.dumps(sts["spec"]["template"]["metadata"])


def test_hostfile_lists_every_pod_with_its_slots() -> None:
    assert cluster_hostfile(job()) == ("job-0.job-workers.ns.svc slots=8\njob-1.job-workers.ns.svc slots=8\n")
    cpu = job(resources={"numNodes": 3, "gpusPerNode": 0}, training={"globalBatchSize": 24})
    assert cluster_hostfile(cpu).count("slots=1") == 3


def test_config_map_holds_the_four_files() -> None:
    data = rendered(job())["ConfigMap"]["data"]
    assert set(data) == {"job.json", "plan.json", "deepspeed.json", "hostfile"}
    assert json.loads(data["job.json"])["spec"]["model"]["uri"] == "meta-llama/Llama-3.1-8B"
    assert json.loads(data["deepspeed.json"])["zero_optimization"]["stage"] == 2


def test_headless_service_publishes_not_ready_addresses() -> None:
    svc = rendered(job())["Service"]
    assert svc["metadata"]["name"] == "job-workers"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_statefulset_shape() -> None:
    sts = rendered(job())["StatefulSet"]
    spec = sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel" and spec["replicas"] == 2
    assert spec["serviceName"] == "job-workers"
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(rendered(job()))
    assert c["command"] == ["ftjob"] and c["args"] == ["train", "--config", "/etc/ftjob"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/dev/shm" in mounts and mounts["/etc/ftjob"]["readOnly"] is True
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"


def test_rendezvous_env_comes_from_the_pod_index() -> None:
    env = {e["name"]: e for e in container(rendered(job()))["env"]}
    assert env["MASTER_ADDR"]["value"] == "job-0.job-workers.ns.svc"
    assert env["NNODES"]["value"] == "2"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["PYTORCH_CUDA_ALLOC_CONF"]["value"] == "expandable_segments:True"


def test_user_strings_stay_data_never_shell() -> None:
    nasty = "$(rm -rf /); `reboot`"
    objs = rendered(job(env=[{"name": "NOTE", "value": nasty}]))
    c = container(objs)
    assert {"name": "NOTE", "value": nasty} in c["env"]
    assert "sh" not in c["command"] and all(nasty not in a for a in c["args"])


def test_user_env_overrides_defaults_and_secrets_stay_references() -> None:
    j = job(
        env=[{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "max_split_size_mb:128"}],
        hfTokenSecretRef={"name": "hf", "key": "token"},
    )
    env = container(rendered(j))["env"]
    values = [e.get("value") for e in env if e["name"] == "PYTORCH_CUDA_ALLOC_CONF"]
    assert values == ["max_split_size_mb:128"]
    token = next(e for e in env if e["name"] == "HF_TOKEN")
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_scheduling_fields_pass_through() -> None:
    j = job(
        resources={
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "training",
            "cpu": "16",
            "memory": "128Gi",
        }
    )
    pod = rendered(j)["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "h100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["priorityClassName"] == "training"
    # the hub model's download cache is a claim per pod, not ephemeral storage
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "16", "memory": "128Gi"}


def test_claims_are_mounted_where_the_trainer_looks() -> None:
    j = job(model={"uri": "pvc://models/llama"}, output={"uri": "pvc://out/run-1"})
    c = container(rendered(j))
    mounts = {m["mountPath"]: m["readOnly"] for m in c["volumeMounts"] if m["mountPath"].startswith("/mnt/pvc")}
    assert mounts == {"/mnt/pvc/data": True, "/mnt/pvc/models": True, "/mnt/pvc/out": False}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FTJOB_OUTPUT_DIR"] == "/mnt/pvc/out/run-1"


def test_owner_reference_and_labels() -> None:
    for obj in render_all(job(), fixed_plan(job().spec), OPTIONS, 2):
        meta = obj["metadata"]
        assert meta["ownerReferences"][0]["uid"] == "u-1" and meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "finetune-operator"
        assert meta["labels"]["finetune.dev/job-name"] == "job"


def test_offline_render_has_no_owner_reference() -> None:
    assert all("ownerReferences" not in o["metadata"] for o in rendered(job(uid=None)).values())


def test_pod_monitor_only_when_enabled() -> None:
    assert "PodMonitor" not in rendered(job())
    monitor = rendered(job(), RenderOptions(pod_monitor=True))["PodMonitor"]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [f"metrics-{i}" for i in range(8)]


def test_config_hash_follows_the_plan() -> None:
    j = job()
    plan = fixed_plan(j.spec)
    other = plan.model_copy(update={"zero_stage": 3})
    assert config_hash(config_map(j, plan)) != config_hash(config_map(j, other))
    template = rendered(j)["StatefulSet"]["spec"]["template"]
    assert template["metadata"]["annotations"]["finetune.dev/config-hash"] == gang_hash(j, plan, OPTIONS)
    assert gang_hash(j, plan, OPTIONS) != gang_hash(j, other, OPTIONS)


def test_gang_hash_follows_image_and_env() -> None:
    j = job()
    plan = fixed_plan(j.spec)
    changed_image = job(image="registry.example/trainer:2")
    changed_env = job(env=[{"name": "NCCL_DEBUG", "value": "INFO"}])
    assert gang_hash(j, plan, OPTIONS) != gang_hash(changed_image, plan, OPTIONS)
    assert gang_hash(j, plan, OPTIONS) != gang_hash(changed_env, plan, OPTIONS)
    assert gang_hash(j, plan, OPTIONS) == gang_hash(job(), plan, OPTIONS)


def test_serving_is_not_the_gangs_business() -> None:
    """spec.serving is applied after training: adding or changing it never restarts a running gang."""
    j = job()
    plan = fixed_plan(j.spec)
    served = job(serving={"target": "Deployment"})
    other = job(serving={"target": "InferenceService", "maxLoraRank": 64})
    assert gang_hash(j, plan, OPTIONS) == gang_hash(served, plan, OPTIONS) == gang_hash(other, plan, OPTIONS)
    assert config_map(served, plan)["data"] == config_map(j, plan)["data"]


@pytest.mark.parametrize(
    ("stage", "opt", "par", "expect_opt", "expect_par"),
    [(2, "none", "none", False, False), (2, "cpu", "none", True, False), (3, "cpu", "cpu", True, True)],
)
def test_deepspeed_config_follows_the_plan(stage: int, opt: str, par: str, expect_opt: bool, expect_par: bool) -> None:
    j = job(deepspeed={"overrides": {"zero_optimization.overlap_comm": False, "communication_data_type": "fp32"}})
    plan = PlanStatus(
        zero_stage=stage,
        offload_optimizer=opt,
        offload_params=par,
        gradient_checkpointing=True,
        micro_batch_size=2,
        gradient_accumulation_steps=4,
        per_gpu_bytes=0,
        gpu_memory_bytes=0,
    )
    config = deepspeed_config(j.spec, plan)
    assert config["train_batch_size"] == 2 * 4 * 16
    assert config["zero_optimization"]["stage"] == stage
    assert ("offload_optimizer" in config["zero_optimization"]) is expect_opt
    assert ("offload_param" in config["zero_optimization"]) is expect_par
    assert config["zero_optimization"]["overlap_comm"] is False
    assert config["communication_data_type"] == "fp32"
    assert config["bf16"]["enabled"] is True and config["gradient_clipping"] == 1.0


@pytest.mark.parametrize(("trainable", "bucket"), [(None, 50_000_000), (21_000_000, 21_000_000), (10**9, 50_000_000)])
def test_the_reduce_bucket_is_no_larger_than_what_trains(trainable: int | None, bucket: int) -> None:
    j = job()
    plan = fixed_plan(j.spec).model_copy(update={"trainable_parameters": trainable})
    zero = deepspeed_config(j.spec, plan)["zero_optimization"]
    assert zero["reduce_bucket_size"] == bucket and zero["allgather_bucket_size"] == 50_000_000
    pinned = job(deepspeed={"overrides": {"zero_optimization.reduce_bucket_size": 123}})
    assert deepspeed_config(pinned.spec, plan)["zero_optimization"]["reduce_bucket_size"] == 123


def test_the_planner_records_the_trainable_count_it_sized_the_buckets_for() -> None:
    from finetune_operator.plan.search.planner import plan_job

    j = job(model={"uri": "org/model", "architecture": "llama-3.1-8b"}, method={"type": "lora"})
    status = plan_job(j.spec).to_status()
    assert status.trainable_parameters is not None and 10**6 < status.trainable_parameters < 10**8
    assert deepspeed_config(j.spec, status)["zero_optimization"]["reduce_bucket_size"] == status.trainable_parameters


def test_without_a_memory_setting_the_pod_requests_the_planned_host_memory() -> None:
    j = job(model={"uri": "pvc://models/llama"})  # no model cache: memory is the only request
    plan = fixed_plan(j.spec).model_copy(update={"host_bytes_per_node": 100 * 2**30 + 1})
    resources = container(by_kind(render_all(j, plan, OPTIONS, 2)))["resources"]
    assert resources["requests"]["memory"] == "102401Mi"  # rounded up, never under the plan
    assert "memory" not in resources["limits"] and resources["limits"]["nvidia.com/gpu"] == 8
    more = plan.model_copy(update={"host_bytes_per_node": 200 * 2**30})
    assert gang_hash(j, plan, OPTIONS) != gang_hash(j, more, OPTIONS), "a new host need rolls the gang"
    pinned = job(resources={"memory": "64Gi"}, model={"uri": "pvc://models/llama"})
    pinned_resources = container(by_kind(render_all(pinned, plan, OPTIONS, 2)))["resources"]
    assert pinned_resources["requests"] == {"memory": "64Gi"} == {"memory": pinned_resources["limits"]["memory"]}
    none = container(by_kind(render_all(j, plan.model_copy(update={"host_bytes_per_node": 0}), OPTIONS, 2)))
    assert "requests" not in none["resources"]


def test_every_env_name_the_operator_sets_is_reserved_or_a_default_users_may_override() -> None:
    """A user env var of a name the operator also sets duplicated the key: the apiserver refused
    the StatefulSet and the job was left without status. Every such name must be reserved."""
    from finetune_operator.api.spec import RESERVED_ENV
    from finetune_operator.render.workers import DEFAULT_ENV, NCCL_ENV

    j = job(
        model={"uri": "meta-llama/Llama-3.1-8B"},
        hfTokenSecretRef={"name": "hf", "key": "token"},
        resources={"numNodes": 2, "gpusPerNode": 8, "cpu": "32"},
    )
    names = [e["name"] for e in container(rendered(j))["env"]]
    overridable = {*DEFAULT_ENV, *NCCL_ENV, "HF_TOKEN", "HF_ENDPOINT", "FTJOB_DOWNLOAD_TIMEOUT_SECONDS"}
    overridable |= {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "FTJOB_STOP_GRACE_SECONDS"}
    assert "FTJOB_PREFETCH_MODEL" in names and "DS_ACCELERATOR" in names
    assert sorted(n for n in names if n not in overridable and n not in RESERVED_ENV) == []
    assert len(names) == len(set(names))


def test_the_largest_env_the_api_admits_renders_children_under_a_mebibyte() -> None:
    """32 KiB env values once made the ConfigMap exceed etcd's 1 MiB and the job got no status."""
    from finetune_operator.api.spec import MAX_ENV_VALUE, MAX_ENV_VARS

    j = job(env=[{"name": f"V{i}", "value": "x" * MAX_ENV_VALUE} for i in range(MAX_ENV_VARS)])
    sizes = {o["kind"]: len(json.dumps(o)) for o in render_all(j, fixed_plan(j.spec), OPTIONS, 2)}
    assert max(sizes.values()) < 1024 * 1024, sizes
