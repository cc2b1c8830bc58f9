"""Where the Go-built control-plane binaries live, and building them when they are missing.

Why: `tools/build-kube-binaries.sh` owns how the binaries are built and the cache layout
(by version, outside the work tree); this module is the one place in Python that knows that
layout, so the harness, the demo and the CLI find the same files and a cold cache is built
(with the build time printed) instead of failing with a missing-file error.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
KUEUE_VERSION = "v0.17.0"
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
"""SeaweedFS (Apache-2.0) has no module-proxy tags: a pinned commit's pseudo-version."""

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-kube-binaries.sh"
BUILD_TIMEOUT_S = 3 * 3600


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "finetune-operator"
    return Path(os.environ.get("FTJOB_CACHE_DIR") or default)


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every binary the local cluster starts, plus kwok's stage examples."""

    kube_bin: Path
    etcd: Path
    kwok: Path
    kwok_stages: Path
    helm: Path
    kueue: Path
    kueue_crds: Path
    """Kueue's CRD yamls, from the same module version as the binary."""
    kueue_webhooks: Path
    """Kueue's webhook configurations (one yaml), from the same module version."""
    weed: Path
    """SeaweedFS's `weed`: the S3-compatible server of the object-storage tests and demo."""

    @property
    def kube_apiserver(self) -> Path:
        return self.kube_bin / "kube-apiserver"

    @property
    def kube_controller_manager(self) -> Path:
        return self.kube_bin / "kube-controller-manager"

    @property
    def kube_scheduler(self) -> Path:
        return self.kube_bin / "kube-scheduler"

    @property
    def kubectl(self) -> Path:
        return self.kube_bin / "kubectl"

    def core_files(self) -> list[Path]:
        """What every local cluster starts (the `core` target of the build script)."""
        return [
            self.kube_apiserver,
            self.kube_controller_manager,
            self.kube_scheduler,
            self.kubectl,
            self.etcd,
            self.kwok,
            self.helm,
        ]

    def present(self, kueue: bool = False, s3: bool = False, core: bool = True) -> bool:
        """The core binaries are built (and Kueue's binary, CRDs and webhooks, and the S3
        server, when asked); `core=False` looks at the asked extras only."""
        if core and not (all(os.access(p, os.X_OK) for p in self.core_files()) and self.kwok_stages.is_dir()):
            return False
        if kueue and not (
            os.access(self.kueue, os.X_OK) and self.kueue_crds.is_dir() and self.kueue_webhooks.is_file()
        ):
            return False
        return not s3 or os.access(self.weed, os.X_OK)


def cached_binaries() -> Binaries:
    root = cache_dir()
    return Binaries(
        kube_bin=root / "kube" / K8S_VERSION / "bin",
        etcd=root / "etcd" / ETCD_VERSION / "bin" / "etcd",
        kwok=root / "kwok" / KWOK_VERSION / "bin" / "kwok",
        kwok_stages=root / "kwok" / KWOK_VERSION / "stage",
        helm=root / "helm" / HELM_VERSION / "bin" / "helm",
        kueue=root / "kueue" / KUEUE_VERSION / "bin" / "kueue",
        kueue_crds=root / "kueue" / KUEUE_VERSION / "crd",
        kueue_webhooks=root / "kueue" / KUEUE_VERSION / "webhook" / "manifests.yaml",
        weed=root / "seaweedfs" / SEAWEEDFS_VERSION / "bin" / "weed",
    )


def ensure_binaries(build: bool = True, kueue: bool = False, s3: bool = False, core: bool = True) -> Binaries:
    """Return the cached binaries, running the build script first when any is missing.

    Kueue and the S3 server are built only for a caller that asks for them (their tests): the
    demo and the other tiers never start them, and each is minutes of a cold first run (the S3
    server ~25 on 2 cores). `core=False` builds and checks only the asked extras.
    """
    bins = cached_binaries()
    if bins.present(kueue=kueue, s3=s3, core=core):
        return bins
    targets = (["core"] if core else []) + (["kueue"] if kueue else []) + (["s3"] if s3 else [])
    if not build:
        raise FileNotFoundError(f"binaries missing under {cache_dir()}; run {BUILD_SCRIPT} {' '.join(targets)}")
    print(f"finetune_localcluster: building {' and '.join(targets)} binaries with {BUILD_SCRIPT}", flush=True)
    subprocess.run(["bash", str(BUILD_SCRIPT), *targets], check=True, timeout=BUILD_TIMEOUT_S)
    if not bins.present(kueue=kueue, s3=s3, core=core):
        raise FileNotFoundError(f"{BUILD_SCRIPT} finished but binaries are missing under {cache_dir()}")
    return bins
