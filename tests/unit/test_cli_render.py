"""`ftjob render`: manifests for a good job, a clear message (not a traceback) for a bad model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from finetune_operator.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_render_prints_the_three_children_and_what_serves_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLES / "lora-8b-2x8.yaml")]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert kinds == ["ConfigMap", "Service", "StatefulSet", "InferenceService"]


def test_unknown_model_is_a_message_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: a}\n"
        "spec:\n  model: {uri: nobody/NoSuchModel}\n  dataset: {uri: /d}\n  output: {uri: /o}\n"
    )
    assert main(["render", str(job)]) == 2
    err = capsys.readouterr().err
    assert "InvalidSpec" in err and "NoSuchModel" in err and "model.architecture" in err
    assert "Traceback" not in err


def test_the_8b_example_renders_placement_cache_overlay_and_token(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13's "done when": what a real 2×8 GPU cluster needs is visible in `ftjob render`."""
    assert main(["render", str(EXAMPLES / "lora-8b-2x8.yaml")]) == 0
    sts = next(d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]
    spec = pod["spec"]
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.memory"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (cache,) = sts["spec"]["volumeClaimTemplates"]
    assert cache["metadata"]["name"] == "model-cache" and cache["spec"]["resources"]["requests"]["storage"] == "40Gi"
    container = spec["containers"][0]
    assert {"name": "model-cache", "mountPath": "/var/cache/ftjob"} in container["volumeMounts"]
    assert container["resources"]["limits"]["rdma/ib"] == "1"
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-sriov"
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}


def test_the_70b_example_gets_a_cache_that_fits_and_a_too_small_one_is_refused_naming_the_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24's "done when": Llama-3.1-70B's 141 GB (131.4 GiB) of bf16 weights fit each pod's cache claim."""
    assert main(["render", str(EXAMPLES / "lora-70b-4x8x80gi.yaml")]) == 0
    sts = next(d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "StatefulSet")
    (cache,) = sts["spec"]["volumeClaimTemplates"]
    assert cache["spec"]["resources"]["requests"]["storage"] == "160Gi"
    assert cache["spec"]["accessModes"] == ["ReadWriteOnce"]
    small = yaml.safe_load((EXAMPLES / "lora-70b-4x8x80gi.yaml").read_text())
    small["spec"]["model"]["cache"] = {"size": "100Gi"}
    job = tmp_path / "small.yaml"
    job.write_text(yaml.safe_dump(small))
    assert main(["render", str(job)]) == 2
    err = capsys.readouterr().err
    assert "InvalidSpec: spec.model.cache.size 100Gi cannot hold meta-llama/Llama-3.1-70B" in err
    assert "its files are 131.4 GiB (141.1 GB); set at least 139Gi, or leave size unset for 160Gi" in err


def test_render_previews_the_serving_objects_and_names_what_cannot_be_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((EXAMPLES / "lora-8b-2x8.yaml").read_text())
    doc["spec"]["serving"] = {"target": "InferenceService", "maxLoraRank": 32}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    assert main(["render", str(job)]) == 0
    rendered = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["kind"] for d in rendered] == ["ConfigMap", "Service", "StatefulSet", "InferenceService"]
    uris = [s["uri"] for s in rendered[-1]["spec"]["predictor"]["storageUris"]]
    assert uris == ["hf://meta-llama/Llama-3.1-8B", f"{doc['spec']['output']['uri'].rstrip('/')}/adapter"]
    doc["spec"]["model"]["uri"] = "/models/in-the-image"
    doc["spec"]["model"]["architecture"] = "meta-llama/Llama-3.1-8B"
    job.write_text(yaml.safe_dump(doc))
    assert main(["render", str(job)]) == 2
    assert "serving: spec.serving.baseModelUri: model.uri '/models/in-the-image'" in capsys.readouterr().err
