"""The gang rendered once per pass (issue 44): the hash taken from the objects returned and Kueue's
placement rendered in, with the same hashes and bytes as before, pinned from the code that rendered
the StatefulSet a second time for its hash and patched the placement in afterwards."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from finetune_operator.api import FineTuneJob
from finetune_operator.api.status import FineTuneJobStatus, Progress
from finetune_operator.cli.manifests import load_one
from finetune_operator.plan import choose_plan
from finetune_operator.render import manifests
from finetune_operator.render.manifests import gang_hash, render_all
from finetune_operator.render.options import RenderOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLACEMENT = {"cloud.example/flavor": "a100", "topology.kubernetes.io/zone": "z1"}
MONITOR = RenderOptions(pod_monitor=True, default_tracking_uri="http://mlflow:5000", gpu_placement="product")  # type: ignore[arg-type]


def _example(name: str) -> FineTuneJob:
    job = load_one(str(EXAMPLES / f"{name}.yaml"))
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": "default"})})


def _digest(objects: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(objects).encode()).hexdigest()[:16]


def _awkward(own_grace: bool = True) -> FineTuneJob:
    """A measured save time (a grace above the floor), its own nodeSelector on a key the placement
    also sets, and its own stop grace in env: every part the hash leaves out, at once."""
    job = _example("tiny-cpu")
    spec = job.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec["resources"]["nodeSelector"] = {"topology.kubernetes.io/zone": "z0", "disk": "ssd"}
    if own_grace:
        spec["env"] = [{"name": "FTJOB_STOP_GRACE_SECONDS", "value": "42"}]
    wire = {**job.model_dump(by_alias=True, exclude_none=True, mode="json"), "spec": spec}
    job = FineTuneJob.from_manifest(wire)
    return job.model_copy(update={"status": FineTuneJobStatus(progress=Progress(checkpoint_save_seconds=900.0))})


# (job, options, gang hash, digest without a placement, digest with PLACEMENT), from the original code
PINNED = [
    ("tiny-cpu", RenderOptions(), "529fed24bff6fdae", "ca42950537892108", "b3603c236c916dc1"),
    ("lora-70b-4x8x80gi", MONITOR, "10bc8ef527e214c5", "ad5d231e69f354d8", "500c62922c20a9c1"),
    ("s3-2nodes-cpu", RenderOptions(), "1d87d292eabc4d4c", "7874592ec09174a8", "93906eeacf5ba9b0"),
    ("qlora-7b-24gi", RenderOptions(), "689e1f1f481c208f", "d0ac62c1ce61d472", "788f3c43acfc5e85"),
    ("awkward", RenderOptions(), "4ca5e82aeef7cfb1", "b1ece0e75365b8eb", "871cc786fadeb4c1"),
    ("measured", RenderOptions(), "308e9562023ae6c8", "877ea1402c377e1f", "9500bc64924497bc"),
]


@pytest.mark.parametrize(("name", "options", "gang", "plain", "placed"), PINNED, ids=[p[0] for p in PINNED])
def test_the_gang_hash_and_the_objects_are_the_ones_rendered_before(
    name: str, options: RenderOptions, gang: str, plain: str, placed: str
) -> None:
    job = _awkward() if name == "awkward" else _awkward(False) if name == "measured" else _example(name)
    plan = choose_plan(job.spec)
    assert gang_hash(job, plan, options) == gang  # no StatefulSet in a cluster rolls on upgrade
    assert _digest(render_all(job, plan, options, 2)) == plain
    assert _digest(render_all(job, plan, options, 2, placement=PLACEMENT)) == placed


def test_one_render_carries_its_hash_and_the_placement() -> None:
    job = _awkward()
    plan = choose_plan(job.spec)
    rendered = manifests.render_gang(job, plan, RenderOptions(), 2, placement=PLACEMENT)
    template = rendered.objects[2]["spec"]["template"]
    assert template["metadata"]["annotations"]["finetune.dev/config-hash"] == rendered.hash
    assert template["spec"]["nodeSelector"] == {"disk": "ssd", **PLACEMENT}  # Kueue's flavor wins a shared key
    assert template["spec"]["terminationGracePeriodSeconds"] > RenderOptions().termination_grace_seconds
    alone = manifests.render_gang(job, plan, RenderOptions(), 0).hash
    assert rendered.hash == gang_hash(job, plan, RenderOptions()) == alone
