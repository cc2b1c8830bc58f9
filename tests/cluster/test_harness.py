"""Tests of the local cluster harness itself: scheduling on simulated GPU nodes, and the
process node really running pods (exit codes, termination messages, restarts, env, volumes,
headless-service DNS, readiness, graceful deletion).

Why: every higher tier (CRD contract, operator end to end) trusts these behaviours; when the
harness breaks, these tests say so directly instead of an operator test failing obscurely.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from finetune_localcluster import (
    KWOK_NODE_SELECTOR,
    PROCESS_NODE_PLACEMENT,
    ClusterError,
    Kube,
    KubeError,
    LocalCluster,
    wait_for,
)
from finetune_localcluster.binaries import ensure_binaries

Obj = dict[str, Any]
WAIT_S = 90


def pod_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}"


def process_pod(name: str, script: str, restart_policy: str = "Never", **container: Any) -> Obj:
    """A pod for the process node running `python -c script` (the venv's Python)."""
    spec: Obj = {
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {"name": "main", "image": "python:3.11", "command": ["python", "-c", textwrap.dedent(script)], **container}
        ],
        **PROCESS_NODE_PLACEMENT,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def phase(kube: Kube, ns: str, name: str, *phases: str) -> Obj | None:
    pod = kube.get(pod_path(ns, name))
    return pod if pod.get("status", {}).get("phase") in phases else None


def test_gpu_statefulset_runs_on_kwok_gpu_nodes(
    kube: Kube, apps_v1: kubernetes.client.AppsV1Api, namespace: str
) -> None:
    labels = {"app": "gpu"}
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "gpu"},
        "spec": {
            "replicas": 2,
            "serviceName": "gpu",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": KWOK_NODE_SELECTOR,
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:latest",
                            "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "1", "memory": "1Gi"}},
                        }
                    ],
                },
            },
        },
    }
    kube.create(f"/apis/apps/v1/namespaces/{namespace}/statefulsets", sts)

    def ready_pods() -> list[Obj] | None:
        pods = kube.items(f"/api/v1/namespaces/{namespace}/pods")
        running = [
            p
            for p in pods
            if p["status"].get("phase") == "Running"
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        ]
        return running if len(running) == 2 else None

    pods = wait_for(ready_pods, WAIT_S, "2 GPU pods Running and Ready")
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert nodes == ["kwok-gpu-0", "kwok-gpu-1"]  # 8 GPUs each: one pod per node
    for pod in pods:
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network("127.1.0.0/16")
    sts_path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/gpu"
    wait_for(lambda: kube.get(sts_path).get("status", {}).get("readyReplicas") == 2, WAIT_S, "readyReplicas == 2")
    assert apps_v1.read_namespaced_stateful_set("gpu", namespace).spec.replicas == 2


def test_gpu_request_beyond_capacity_stays_pending(kube: Kube, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "9"}}}]},
    }
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)

    def failed_scheduling() -> Obj | None:
        events = kube.items(
            f"/api/v1/namespaces/{namespace}/events",
            fieldSelector="involvedObject.name=too-big,reason=FailedScheduling",
        )
        return events[0] if events else None

    event = wait_for(failed_scheduling, WAIT_S, "a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in event["message"]
    # the Event and the pod's condition are two writes: the condition may land a moment later
    status = wait_for(
        lambda: (got := kube.get(pod_path(namespace, "too-big")))["status"].get("conditions") and got,
        WAIT_S,
        "the PodScheduled condition",
    )
    assert status["status"]["phase"] == "Pending"
    assert not status["spec"].get("nodeName")
    scheduled = next(c for c in status["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")


@pytest.mark.parametrize(
    ("script", "policy", "expected"),
    [
        ("open('/dev/termination-log', 'w').write('all done')", "File", ("Succeeded", 0, "Completed", "all done")),
        (
            "import sys; open('/dev/termination-log', 'w').write('bad input'); sys.exit(3)",
            "File",
            ("Failed", 3, "Error", "bad input"),
        ),
        (
            "import sys; print('traceback: boom', flush=True); sys.exit(2)",
            "FallbackToLogsOnError",
            ("Failed", 2, "Error", "traceback: boom"),
        ),
    ],
    ids=["success", "failure-with-message", "fallback-to-logs"],
)
def test_process_node_reports_exit_code_and_termination_message(
    kube: Kube, namespace: str, script: str, policy: str, expected: tuple[str, int, str, str]
) -> None:
    kube.create(f"/api/v1/namespaces/{namespace}/pods", process_pod("once", script, terminationMessagePolicy=policy))
    pod = wait_for(lambda: phase(kube, namespace, "once", "Succeeded", "Failed"), WAIT_S, "pod to finish")
    assert pod["spec"]["nodeName"] == "process-node-0"
    status = pod["status"]["containerStatuses"][0]
    terminated = status["state"]["terminated"]
    want_phase, want_code, want_reason, want_message = expected
    assert pod["status"]["phase"] == want_phase
    assert (terminated["exitCode"], terminated["reason"]) == (want_code, want_reason)
    assert want_message in terminated["message"]
    assert status["restartCount"] == 0


def test_restart_always_restarts_and_records_last_state(kube: Kube, namespace: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        process_pod("loop", "open('/dev/termination-log', 'w').write('pass')", restart_policy="Always"),
    )

    def restarted() -> Obj | None:
        statuses = kube.get(pod_path(namespace, "loop")).get("status", {}).get("containerStatuses") or []
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 2 else None

    status = wait_for(restarted, WAIT_S, "two restarts")
    last = status["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"], last["message"]) == (0, "Completed", "pass")
    assert kube.get(pod_path(namespace, "loop"))["status"]["phase"] == "Running"


def test_env_field_refs_config_and_secret_are_visible_to_the_process(kube: Kube, namespace: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "cfg"}, "data": {"hostfile": "worker-0 slots=2\n", "mode": "fast"}},
    )
    kube.create(
        f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": "tok"}, "stringData": {"token": "s3cret"}}
    )
    script = """
        import json, os
        keys = ["POD_NAME", "POD_NAMESPACE", "POD_IP", "ORDINAL", "MODE", "TOKEN", "GREETING"]
        out = {k: os.environ.get(k) for k in keys}
        out["hostfile"] = open("/etc/ftjob/hostfile").read()
        out["cwd"] = os.getcwd()
        open("/dev/termination-log", "w").write(json.dumps(out))
    """
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "ORDINAL",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}},
        },
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
        {"name": "GREETING", "value": "hello $(POD_NAME)"},
    ]
    pod = process_pod(
        "envpod",
        script,
        env=env,
        workingDir="/workspace",
        volumeMounts=[
            {"name": "cfg", "mountPath": "/etc/ftjob", "readOnly": True},
            {"name": "work", "mountPath": "/workspace"},
        ],
    )
    pod["metadata"]["labels"] = {"apps.kubernetes.io/pod-index": "1"}
    pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "work", "emptyDir": {}}]
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    done = wait_for(lambda: phase(kube, namespace, "envpod", "Succeeded", "Failed"), WAIT_S, "pod to finish")
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert done["status"]["phase"] == "Succeeded", terminated
    seen = json.loads(terminated["message"])
    assert seen == {
        "POD_NAME": "envpod",
        "POD_NAMESPACE": namespace,
        "POD_IP": done["status"]["podIP"],
        "ORDINAL": "1",
        "MODE": "fast",
        "TOKEN": "s3cret",
        "GREETING": "hello envpod",
        "hostfile": "worker-0 slots=2\n",
        "cwd": "/workspace",
    }
    assert ipaddress.ip_address(seen["POD_IP"]) in ipaddress.ip_network("127.2.0.0/16")


def test_a_volume_at_tmp_hides_no_other_volume(kube: Kube, local_cluster: LocalCluster, namespace: str) -> None:
    """The claims and the pod's files live under the cluster's work dir in /tmp: an emptyDir
    mounted at /tmp (as the model inspector pod has) must not hide them from the other mounts."""
    from finetune_localcluster.devtools import bind_claim

    bind_claim(kube, namespace, "data")
    claim = local_cluster.workdir / "pvc" / namespace / "data"
    claim.mkdir(parents=True, exist_ok=True)
    (claim / "config.json").write_text('{"on": "the claim"}')
    kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "cfg"}, "data": {"k": "v"}})
    script = """
        import json, os
        out = {"claim": open("/mnt/data/config.json").read(), "nested": open("/tmp/cfg/k").read(),
               "tmp": sorted(os.listdir("/tmp"))}
        open("/dev/termination-log", "w").write(json.dumps(out))
    """
    pod = process_pod(
        "shadowed",
        script,
        volumeMounts=[
            {"name": "cfg", "mountPath": "/tmp/cfg", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "data", "mountPath": "/mnt/data", "readOnly": True},
        ],
    )
    pod["spec"]["volumes"] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
    ]
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    done = wait_for(lambda: phase(kube, namespace, "shadowed", "Succeeded", "Failed"), WAIT_S, "pod to finish")
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert done["status"]["phase"] == "Succeeded", terminated
    assert json.loads(terminated["message"]) == {"claim": '{"on": "the claim"}', "nested": "v", "tmp": ["cfg"]}


PEER_SCRIPT = """
    import json, os, socket, threading, time
    me, ns = os.environ["POD_NAME"], os.environ["POD_NAMESPACE"]
    peer = "peers-%d.peers.%s.svc.cluster.local" % (1 - int(os.environ["ORDINAL"]), ns)
    served = threading.Event()
    server = socket.create_server((os.environ["POD_IP"], 29511))

    def serve():
        while True:
            conn, _ = server.accept()
            conn.sendall(me.encode())
            conn.close()
            served.set()

    threading.Thread(target=serve, daemon=True).start()
    deadline = time.monotonic() + 60
    while True:
        try:
            peer_ip = socket.gethostbyname(peer)
            with socket.create_connection((peer_ip, 29511), timeout=2) as conn:
                reply = conn.recv(100).decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    served.wait(60)
    open("/dev/termination-log", "w").write(json.dumps({"peer_ip": peer_ip, "reply": reply}))
"""


def test_headless_service_pods_resolve_and_reach_each_other(kube: Kube, namespace: str) -> None:
    labels = {"app": "peers"}
    kube.create(
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "selector": labels,
                "publishNotReadyAddresses": True,
                "ports": [{"name": "p", "port": 29511}],
            },
        },
    )
    env = [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
        for n, f in (
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_IP", "status.podIP"),
            ("ORDINAL", "metadata.labels['apps.kubernetes.io/pod-index']"),
        )
    ]
    template = process_pod("unused", PEER_SCRIPT, restart_policy="Always", env=env)
    template["metadata"] = {"labels": labels}
    kube.create(
        f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "peers"},
            "spec": {
                "replicas": 2,
                "serviceName": "peers",
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": template,
            },
        },
    )

    def finished_once(name: str) -> Obj | None:
        statuses = kube.get(pod_path(namespace, name)).get("status", {}).get("containerStatuses") or []
        return statuses[0]["lastState"]["terminated"] if statuses and statuses[0]["restartCount"] >= 1 else None

    results = {
        n: wait_for(functools.partial(finished_once, n), WAIT_S, f"{n} to finish a run") for n in ("peers-0", "peers-1")
    }
    ips = {n: kube.get(pod_path(namespace, n))["status"]["podIP"] for n in results}
    for name, other in (("peers-0", "peers-1"), ("peers-1", "peers-0")):
        assert results[name]["exitCode"] == 0, results[name]
        seen = json.loads(results[name]["message"])
        assert seen == {"peer_ip": ips[other], "reply": other}


def test_readiness_probe_and_graceful_deletion(
    kube: Kube, core_v1: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    script = """
        import pathlib, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        time.sleep(1)
        pathlib.Path("/scratch/ready").touch()
        while True:
            time.sleep(0.1)
    """
    pod = process_pod(
        "probed",
        script,
        restart_policy="Always",
        readinessProbe={"exec": {"command": ["test", "-f", "/scratch/ready"]}, "periodSeconds": 1},
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    pod["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {"medium": "Memory"}}]
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)

    def ready() -> bool:
        conds = kube.get(pod_path(namespace, "probed")).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    wait_for(ready, WAIT_S, "readiness probe to pass")
    assert kube.get(pod_path(namespace, "probed"))["status"]["containerStatuses"][0]["ready"] is True
    core_v1.delete_namespaced_pod("probed", namespace, grace_period_seconds=30)
    wait_for(
        lambda: kube.get_or_none(pod_path(namespace, "probed")) is None,
        20,
        "the pod object to be deleted after its process exited on SIGTERM",
    )


def test_rbac_is_enforced(kube: Kube, namespace: str) -> None:
    as_default_sa = {"Impersonate-User": f"system:serviceaccount:{namespace}:default"}
    with pytest.raises(KubeError) as denied:
        kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", headers=as_default_sa)
    assert denied.value.status == 403
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    listing = wait_for(
        lambda: kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", headers=as_default_sa),
        WAIT_S,
        "the RoleBinding to take effect",
    )
    assert listing["items"] == []


RESTRICTED_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_restricted_namespace_enforces_pod_security(kube: Kube, restricted_namespace: str) -> None:
    pods = f"/api/v1/namespaces/{restricted_namespace}/pods"
    with pytest.raises(KubeError) as rejected:
        kube.create(pods, process_pod("loose", "pass"))
    assert rejected.value.status == 403
    assert "violates PodSecurity" in str(rejected.value)
    compliant = process_pod("tight", "pass", securityContext=RESTRICTED_CONTAINER_SECURITY)
    compliant["spec"]["securityContext"] = RESTRICTED_POD_SECURITY
    kube.create(pods, compliant)
    done = wait_for(lambda: phase(kube, restricted_namespace, "tight", "Succeeded", "Failed"), WAIT_S, "pod to finish")
    assert done["status"]["phase"] == "Succeeded"


def test_kubectl_logs_shows_the_process_output(kube: Kube, local_cluster: LocalCluster, namespace: str) -> None:
    kube.create(f"/api/v1/namespaces/{namespace}/pods", process_pod("talker", "print('line one'); print('line two')"))
    wait_for(lambda: phase(kube, namespace, "talker", "Succeeded"), WAIT_S, "pod to succeed")
    env = {**os.environ, **local_cluster.env()}
    out = subprocess.run(
        ["kubectl", "logs", "-n", namespace, "talker"], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.splitlines() == ["line one", "line two"]
    tail = subprocess.run(
        ["kubectl", "logs", "-n", namespace, "talker", "--tail=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert tail.stdout == "line two\n"


def test_startup_failure_names_the_component_and_cleans_up(tmp_path: Path) -> None:
    fake_etcd = tmp_path / "etcd"
    fake_etcd.write_text("#!/bin/sh\necho 'fatal: the data dir is corrupt' >&2\nexit 1\n")
    fake_etcd.chmod(0o755)
    workdir = tmp_path / "cluster"
    cluster = LocalCluster(workdir, gpu_nodes=0, binaries=dataclasses.replace(ensure_binaries(), etcd=fake_etcd))
    with pytest.raises(ClusterError, match=r"(?s)etcd exited.*fatal: the data dir is corrupt"):
        cluster.up()
    assert not workdir.exists()
    assert cluster.procs == []


def test_a_control_plane_component_that_exits_is_started_again(
    local_cluster: LocalCluster, kube: Kube, namespace: str
) -> None:
    """As the kubelet restarts a static pod. kube-scheduler exits on purpose when it finds its
    cache corrupted (seen after an apiserver outage in the robustness tier); nothing was ever
    scheduled again until this harness restarted it."""
    import signal

    old = next(p for p in local_cluster.procs if p["name"] == "kube-scheduler")
    restarts = local_cluster.restarts.get("kube-scheduler", 0)
    os.killpg(old["pid"], signal.SIGKILL)
    wait_for(lambda: local_cluster.restarts.get("kube-scheduler", 0) > restarts, WAIT_S, "the scheduler's restart")
    new = next(p for p in local_cluster.procs if p["name"] == "kube-scheduler")
    assert new["pid"] != old["pid"] and new["argv"] == old["argv"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "after-restart"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "nodeSelector": KWOK_NODE_SELECTOR},
    }
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    bound = wait_for(lambda: kube.get(pod_path(namespace, "after-restart"))["spec"].get("nodeName"), 60, "a binding")
    assert bound.startswith("kwok-gpu-")


def test_a_followed_log_ends_when_its_container_stops(kube: Kube, local_cluster: LocalCluster, namespace: str) -> None:
    """`kubectl logs -f` ends as with a real kubelet: after the container's last line, once it has
    exited (the SDK's and `ftjob logs -f`'s way of noticing a restart relies on it)."""
    script = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(1)\n"
    kube.create(f"/api/v1/namespaces/{namespace}/pods", process_pod("ticker", script))
    wait_for(lambda: phase(kube, namespace, "ticker", "Running", "Succeeded"), WAIT_S, "pod to start")
    env = {**os.environ, **local_cluster.env()}
    started = time.monotonic()
    out = subprocess.run(
        ["kubectl", "logs", "-f", "-n", namespace, "ticker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"tick {i}" for i in range(4)], out.stdout
    assert time.monotonic() - started < 30  # it ended with the container, not at the follow limit (an hour)


def test_logs_are_the_current_run_and_previous_the_one_before(
    kube: Kube, local_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """As a kubelet: a restarted container's log is its current run; `--previous` is the run before."""
    runs = tmp_path / "runs"
    script = f"""
        import pathlib, sys
        runs = pathlib.Path({str(runs)!r})
        n = int(runs.read_text()) if runs.exists() else 0
        runs.write_text(str(n + 1))
        print("run", n, flush=True)
        sys.exit(1 if n == 0 else 0)
    """
    kube.create(f"/api/v1/namespaces/{namespace}/pods", process_pod("twice", script, restart_policy="OnFailure"))
    wait_for(lambda: phase(kube, namespace, "twice", "Succeeded"), WAIT_S, "the second run to succeed")
    env = {**os.environ, **local_cluster.env()}

    def logs(*flags: str) -> str:
        command = ["kubectl", "logs", "-n", namespace, "twice", *flags]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True).stdout

    assert logs() == "run 1\n"
    assert logs("--previous") == "run 0\n"
