"""What a pod's processes see: env, volume files and /etc/hosts, computed from the pod spec.

Why a module of its own: these are the parts of the kubelet's job that the operator and the
trainer agree on through the pod spec (downward-API env such as the pod-index label,
ConfigMap/Secret keys, the headless-service names the ranks resolve), so they are kept
apart from the process and status bookkeeping in `process_node.py`, and readable on their
own. Missing ConfigMaps, Secrets or keys raise `NotReadyYet`; the agent retries, as a
kubelet does.
"""

from __future__ import annotations

import base64
import os
import re
import sys
from pathlib import Path

from finetune_localcluster.kube import Kube, Obj

VENV_BIN = Path(sys.executable).parent
BASE_PATH = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")
_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


class NotReadyYet(Exception):
    """A referenced object or key is missing, or a feature is unsupported; retried later."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are replaced, `$$` escapes `$`."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def hostname(pod: Obj) -> str:
    return str(pod["spec"].get("hostname") or pod["metadata"]["name"])


class PodView:
    """One pod as its node sees it: the object, its IP and the node's name."""

    def __init__(self, kube: Kube, pod: Obj, ip: str, node_name: str) -> None:
        self.kube, self.pod, self.ip, self.node_name = kube, pod, ip, node_name
        self.meta: Obj = pod["metadata"]
        self.spec: Obj = pod["spec"]
        self.ns: str = self.meta["namespace"]

    def field_value(self, path: str) -> str:
        simple = {
            "metadata.name": self.meta["name"],
            "metadata.namespace": self.ns,
            "metadata.uid": self.meta["uid"],
            "spec.nodeName": self.node_name,
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
        }
        if path in simple:
            return str(simple[path])
        m = _LABEL_REF.fullmatch(path)
        if m:
            return str(self.meta.get(m.group(1), {}).get(m.group(2), ""))
        raise NotReadyYet(f"unsupported fieldRef {path}")

    def data(self, kind: str, name: str, optional: bool) -> dict[str, bytes]:
        """The keys of a ConfigMap (`configmaps`) or Secret (`secrets`) as bytes."""
        obj = self.kube.get_or_none(f"/api/v1/namespaces/{self.ns}/{kind}/{name}")
        if obj is None:
            if optional:
                return {}
            raise NotReadyYet(f"{kind[:-1]} {self.ns}/{name} not found")
        plain = obj.get("data") if kind == "configmaps" else None
        coded = obj.get("binaryData") if kind == "configmaps" else obj.get("data")
        out = {k: v.encode() for k, v in (plain or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (coded or {}).items()})
        return out

    def key_ref(self, ref: Obj, kind: str) -> bytes | None:
        data = self.data(kind, ref["name"], bool(ref.get("optional")))
        if ref["key"] not in data and not ref.get("optional"):
            raise NotReadyYet(f"key {ref['key']} not in {kind[:-1]} {self.ns}/{ref['name']}")
        return data.get(ref["key"])

    def container_env(self, container: Obj) -> dict[str, str]:
        env = {"PATH": BASE_PATH, "HOME": "/root", "HOSTNAME": hostname(self.pod), "LANG": "C.UTF-8"}
        if os.environ.get("PYTHONPATH"):
            # the node's own source tree is the "image": a worktree's code runs in its pods
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        for src in container.get("envFrom", []):
            for key, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
                if key in src:
                    data = self.data(kind, src[key]["name"], bool(src[key].get("optional")))
                    env.update({src.get("prefix", "") + k: v.decode() for k, v in data.items()})
        for e in container.get("env", []):
            vf = e.get("valueFrom")
            if vf is None:
                env[e["name"]] = expand(e.get("value", ""), env)
            elif "fieldRef" in vf:
                env[e["name"]] = self.field_value(vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                env[e["name"]] = "0"
            else:
                kind = "configmaps" if "configMapKeyRef" in vf else "secrets"
                value = self.key_ref(vf.get("configMapKeyRef") or vf["secretKeyRef"], kind)
                if value is not None:
                    env[e["name"]] = value.decode()
        return env

    def volumes(self, volumes_dir: Path, pvc_root: Path) -> dict[str, Path]:
        """Materialise every volume of the pod; returns volume name -> host directory."""
        out: dict[str, Path] = {}
        for v in self.spec.get("volumes", []):
            target = volumes_dir / v["name"]
            files: dict[str, bytes] = {}
            sources: list[tuple[str, Obj]] = []
            if "emptyDir" in v:
                if (v["emptyDir"] or {}).get("medium") == "Memory":
                    target = Path("/dev/shm") / f"ftjob-{self.meta['uid']}-{v['name']}"
            elif "persistentVolumeClaim" in v:
                target = pvc_root / self.ns / v["persistentVolumeClaim"]["claimName"]
            elif "hostPath" in v:
                target = Path(v["hostPath"]["path"])
            elif "configMap" in v or "secret" in v:
                sources = [("configMap", v["configMap"])] if "configMap" in v else [("secret", v["secret"])]
            elif "projected" in v:
                sources = [(k, s[k]) for s in v["projected"]["sources"] for k in ("configMap", "secret") if k in s]
            elif "downwardAPI" in v:
                files = {
                    i["path"]: self.field_value(i["fieldRef"]["fieldPath"]).encode()
                    for i in v["downwardAPI"]["items"]
                    if "fieldRef" in i
                }
            else:
                raise NotReadyYet(f"volume {v['name']}: type not supported by the process node")
            for kind, ref in sources:
                name = ref.get("name") or ref.get("secretName", "")
                optional = bool(ref.get("optional"))
                data = self.data("configmaps" if kind == "configMap" else "secrets", name, optional)
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    if item["key"] not in data and not optional:
                        raise NotReadyYet(f"key {item['key']} not in {kind} {self.ns}/{name}")
                    files[item["path"]] = data.get(item["key"], b"")
            target.mkdir(parents=True, exist_ok=True)
            for rel, content in files.items():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                (target / rel).write_bytes(content)
            out[v["name"]] = target
        return out


def hosts_file(pod: Obj, ip: str, namespace_pods: list[Obj]) -> str:
    """/etc/hosts content: this pod, and `<hostname>.<subdomain>.<ns>.svc[.cluster.local]`
    of every pod of the namespace that has a subdomain and an IP (what cluster DNS answers
    for a headless Service named like the subdomain)."""
    lines = [
        "# written by the finetune_localcluster process node",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    own_uid, ns = pod["metadata"]["uid"], pod["metadata"]["namespace"]
    others = [p for p in namespace_pods if p["metadata"]["uid"] != own_uid]
    for other in [pod, *others]:
        spec, own = other["spec"], other["metadata"]["uid"] == own_uid
        other_ip = ip if own else other.get("status", {}).get("podIP")
        sub, host = spec.get("subdomain"), hostname(other)
        if not other_ip or not (own or sub):
            continue
        names = [f"{host}.{sub}.{ns}.svc.cluster.local", f"{host}.{sub}.{ns}.svc", f"{host}.{sub}"] if sub else []
        lines.append(f"{other_ip}\t" + " ".join(names + ([host] if own else [])))
    return "\n".join(lines) + "\n"
