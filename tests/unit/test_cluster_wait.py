"""`LocalCluster.restart` waits for a component to answer again while the cluster's supervisor
runs. A component restarted under load can exit once more; the supervisor then starts it again.
The wait follows the new process. (In a CI run it looked the old pid up, which the supervisor
had dropped, and failed with KeyError. The robustness tier's shared cluster then stayed broken.)"""

from __future__ import annotations

import threading
from pathlib import Path

from finetune_localcluster.cluster import LocalCluster


def test_the_wait_follows_a_component_the_supervisor_started_again(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", detach=True, startup_timeout_s=30)
    (cluster.workdir / "logs").mkdir(parents=True)
    marker = tmp_path / "ran-once"
    # The first start exits at once (as a restarted apiserver did); the supervisor's restart stays up.
    argv = ["sh", "-c", f"test -e {marker} && exec sleep 60; touch {marker}; exit 3"]
    first = cluster._start("kube-apiserver", argv)
    cluster._supervisor = threading.Thread(target=cluster._supervise, daemon=True)
    cluster._supervisor.start()
    try:

        def replacement_up() -> bool:
            now = next(p for p in cluster.procs if p["name"] == "kube-apiserver")
            return bool(now["pid"] != first["pid"])

        cluster._wait("kube-apiserver to answer again", replacement_up, first)
        assert cluster.restarts == {"kube-apiserver": 1}
        assert "exited with 3; restart 1 by the local cluster" in Path(first["log"]).read_text()
    finally:
        cluster.down()
    assert cluster.procs == []
