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

    def present(self, kueue: bool = False) -> bool:
        """The core binaries are built (and Kueue's binary, CRDs and webhooks, when asked)."""
        core = all(os.access(p, os.X_OK) for p in self.core_files()) and self.kwok_stages.is_dir()
        if not kueue:
            return core
        return core and os.access(self.kueue, os.X_OK) and self.kueue_crds.is_dir() and self.kueue_webhooks.is_file()


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
    )


def ensure_binaries(build: bool = True, kueue: bool = False) -> Binaries:
    """Return the cached binaries, running the build script first when any is missing.

    Kueue is built only for a caller that asks for it (the Kueue tests): the demo and the
    other tiers never start it, and it is ~5 minutes of a cold first run.
    """
    bins = cached_binaries()
    if bins.present(kueue=kueue):
        return bins
    targets = ["core", "kueue"] if kueue else ["core"]
    if not build:
        raise FileNotFoundError(
            f"Kubernetes binaries missing under {cache_dir()}; run {BUILD_SCRIPT} {' '.join(targets)}"
        )
    print(f"finetune_localcluster: building {' and '.join(targets)} binaries with {BUILD_SCRIPT}", flush=True)
    subprocess.run(["bash", str(BUILD_SCRIPT), *targets], check=True, timeout=BUILD_TIMEOUT_S)
    if not bins.present(kueue=kueue):
        raise FileNotFoundError(f"{BUILD_SCRIPT} finished but binaries are missing under {cache_dir()}")
    return bins
