"""The process node's pod env: the node's PYTHONPATH reaches the pods, as an image's code would."""

from __future__ import annotations

from typing import Any

import pytest

from finetune_localcluster.pod_contents import PodView

POD: dict[str, Any] = {
    "metadata": {"name": "job-0", "namespace": "ns", "uid": "u"},
    "spec": {"containers": [{"name": "trainer"}]},
}


@pytest.mark.parametrize("node_path", ["/work/wt-1/operator:/work/wt-1/trainer_image", None])
def test_pods_run_the_nodes_source_tree(monkeypatch: pytest.MonkeyPatch, node_path: str | None) -> None:
    if node_path is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", node_path)
    view = PodView(None, POD, "10.0.0.2", "process-node")  # type: ignore[arg-type]  # no refs to look up
    env = view.container_env({"name": "trainer", "env": [{"name": "X", "value": "1"}]})
    assert env.get("PYTHONPATH") == node_path and env["X"] == "1"
    overridden = view.container_env({"name": "trainer", "env": [{"name": "PYTHONPATH", "value": "/mine"}]})
    assert overridden["PYTHONPATH"] == "/mine"  # the pod's own env still wins
