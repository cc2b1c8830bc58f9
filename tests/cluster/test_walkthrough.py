"""docs/guides/python-client.md runs: its python blocks, in order, in one namespace of names, against
the local cluster with the real operator (and its last block with `ftjob run` on this machine).

The page's `job.yaml` is examples/tiny-cpu.yaml, 4 steps long and placed on the process node; the
client finds the test's namespace as a user's would, from the kubeconfig's current context.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_localcluster import Kube
from finetune_localcluster.devtools import OperatorProcess, bind_claim
from tests.cluster.process_jobs import CLAIM, tiny_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "python-client.md"
STEPS = 4


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.DOTALL | re.MULTILINE)


def test_the_page_has_the_walkthrough_blocks() -> None:
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) == 7, blocks
    assert "client.submit(" in blocks[0] and "client.logs(" in blocks[1] and "client.wait(" in blocks[2]


def test_the_walkthrough_runs(
    kube: Kube,
    kubeconfig: Path,
    restricted_namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bind_claim(kube, restricted_namespace, CLAIM)
    config = yaml.safe_load(kubeconfig.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = restricted_namespace
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    doc = tiny_job(restricted_namespace, max_steps=STEPS, checkpoint_every=STEPS)
    del doc["metadata"]["namespace"]  # the client's namespace: the context's
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.chdir(tmp_path)
    names: dict[str, Any] = {}
    try:
        for block in python_blocks(PAGE.read_text()):
            exec(compile(block, str(PAGE), "exec"), names)
    finally:
        if "client" in names:
            names["client"].close()
    out = capsys.readouterr().out
    assert f"submitted tiny-cpu to {restricted_namespace}" in out, out
    assert names["done"].status.state == "Succeeded" and names["result"].steps == STEPS, out
    assert f"step {STEPS}/{STEPS} loss " in out, out
    assert "adapter: pvc://ftjob-output/tiny-cpu/adapter" in out, out
    assert "spec.serving.baseModelUri: model.uri 'builtin://tiny-llama' is not a location" in out, out
    assert "['metadata.labels: Invalid value: " in out, out
    assert f"locally: Succeeded {STEPS} steps" in out, out
