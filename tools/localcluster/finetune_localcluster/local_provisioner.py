"""A dynamic provisioner for the local cluster: claims of its StorageClass get a volume, as on a real cluster.

Why: a hub model's cache is a claim per trainer pod, created by the StatefulSet controller from
its volumeClaimTemplates; without a provisioner those claims stay Pending and so do the pods.
This plays an external provisioner (what sig-storage's provisioner library does, for a local
path): the kube-controller-manager's PV controller marks a claim of a class whose provisioner is
external with `volume.kubernetes.io/storage-provisioner`; this loop then creates a
PersistentVolume pre-bound to the claim (`claimRef` with its uid; capacity, access modes and
class from the claim; `pv.kubernetes.io/provisioned-by`), and the PV controller binds the two.
With `volumeBindingMode: WaitForFirstConsumer` it waits for the scheduler's
`volume.kubernetes.io/selected-node`, and pins the volume to that node. A volume it provisioned
whose claim is deleted (Released, reclaim policy Delete) is deleted with its data.

The data lives where the process nodes keep every claim's files (`<pvc-root>/<ns>/<claim>`), which
is also the volume's hostPath. Run by `LocalCluster` as one more supervised process.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import requests

from finetune_localcluster.kube import Kube, KubeError, Obj

PROVISIONER = "finetune.dev/local-path"
STORAGE_CLASS = "ftjob-local-path"
PROVISIONER_ANNOTATIONS = ("volume.kubernetes.io/storage-provisioner", "volume.beta.kubernetes.io/storage-provisioner")
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
POLL_S = 0.5


def storage_class(default: bool = True, binding_mode: str = "Immediate") -> Obj:
    """The class whose claims this provisioner serves (the cluster's default class unless `default` is False)."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": annotations},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": binding_mode,
    }


class LocalProvisioner:
    def __init__(self, kube: Kube, pvc_root: Path) -> None:
        self.kube, self.pvc_root = kube, pvc_root

    def sync(self) -> None:
        classes = {c["metadata"]["name"]: c for c in self.kube.items("/apis/storage.k8s.io/v1/storageclasses")}
        for claim in self.kube.items("/api/v1/persistentvolumeclaims"):
            sc = classes.get(claim["spec"].get("storageClassName") or "")
            if sc is not None and sc.get("provisioner") == PROVISIONER and self._wanted(claim, sc):
                self.provision(claim, sc)
        for volume in self.kube.items("/api/v1/persistentvolumes"):
            self._reclaim(volume)

    @staticmethod
    def _wanted(claim: Obj, sc: Obj) -> bool:
        meta, status = claim["metadata"], claim.get("status") or {}
        annotations = meta.get("annotations") or {}
        if meta.get("deletionTimestamp") or claim["spec"].get("volumeName") or status.get("phase") != "Pending":
            return False
        if not any(annotations.get(key) == PROVISIONER for key in PROVISIONER_ANNOTATIONS):
            return False  # the PV controller has not handed it to an external provisioner (yet)
        return sc.get("volumeBindingMode") != "WaitForFirstConsumer" or SELECTED_NODE in annotations

    def provision(self, claim: Obj, sc: Obj) -> None:
        meta = claim["metadata"]
        path = self.pvc_root / meta["namespace"] / meta["name"]
        volume: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{meta['uid']}", "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                "accessModes": claim["spec"].get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                "storageClassName": sc["metadata"]["name"],
                "volumeMode": claim["spec"].get("volumeMode", "Filesystem"),
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        node = (meta.get("annotations") or {}).get(SELECTED_NODE)
        if node:
            volume["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}  # fmt: skip
        try:
            self.kube.create("/api/v1/persistentvolumes", volume)
        except KubeError as exc:
            if exc.status != 409:  # provisioned on an earlier pass, not yet bound
                raise
            return
        path.mkdir(parents=True, exist_ok=True)
        print(f"provisioned {volume['metadata']['name']} for {meta['namespace']}/{meta['name']}", flush=True)

    def _reclaim(self, volume: Obj) -> None:
        meta, spec = volume["metadata"], volume["spec"]
        mine = (meta.get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER
        released = (volume.get("status") or {}).get("phase") in ("Released", "Failed")
        if not (mine and released and spec.get("persistentVolumeReclaimPolicy") == "Delete"):
            return
        path = Path(spec.get("hostPath", {}).get("path", ""))
        if path.is_relative_to(self.pvc_root):
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.kube.delete(f"/api/v1/persistentvolumes/{meta['name']}")
        except KubeError as exc:
            if exc.status != 404:
                raise
        print(f"deleted {meta['name']} and its data", flush=True)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync()
            except (KubeError, requests.RequestException, OSError, KeyError):
                traceback.print_exc()
            stop.wait(POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="dynamic local-path provisioner of the local cluster")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--pvc-root", type=Path, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    kube = Kube(args.kubeconfig)
    try:
        LocalProvisioner(kube, args.pvc_root).run(stop)
    finally:
        kube.close()
    return 0


def apply_storage_class(kube: Kube, **kwargs: Any) -> None:
    kube.create("/apis/storage.k8s.io/v1/storageclasses", storage_class(**kwargs))


if __name__ == "__main__":
    sys.exit(main())
