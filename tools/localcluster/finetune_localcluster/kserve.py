"""KServe's own CRDs on the local cluster, from KServe's Go module at a pinned version.

`go mod download` puts the module (its `config/crd/full` manifests included) in the Go module
cache once per machine; the CRDs are server-side applied into the local apiserver, so the
serving objects the operator renders are validated by KServe's real OpenAPI schemas. KServe's
controllers and webhooks do not run here: nothing reconciles an InferenceService, which is
what a test of rendering and applying wants.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from finetune_localcluster.kube import Kube

KSERVE_MODULE = "github.com/kserve/kserve"
KSERVE_VERSION = "v0.16.0"
CRD_FILES = (
    "config/crd/full/serving.kserve.io_inferenceservices.yaml",
    "config/crd/full/serving.kserve.io_servingruntimes.yaml",
    "config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml",
)


def module_dir(version: str = KSERVE_VERSION) -> Path:
    """KServe's module in the Go module cache (downloaded through the module proxy the first time)."""
    with tempfile.TemporaryDirectory() as scratch:  # outside any go.mod
        done = subprocess.run(
            ["go", "mod", "download", "-json", f"{KSERVE_MODULE}@{version}"],
            cwd=scratch, capture_output=True, text=True, timeout=900, check=False,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )  # fmt: skip
    info = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    if done.returncode != 0 or "Dir" not in info:
        raise RuntimeError(f"go mod download {KSERVE_MODULE}@{version} failed: {info.get('Error') or done.stderr}")
    return Path(info["Dir"])


def crds(version: str = KSERVE_VERSION) -> list[dict[str, object]]:
    root = module_dir(version)
    return [yaml.safe_load((root / name).read_text()) for name in CRD_FILES]


def install(kube: Kube, version: str = KSERVE_VERSION, timeout: float = 60.0) -> list[str]:
    """Apply KServe's CRDs and wait until each is Established; returns their names."""
    names = []
    for crd in crds(version):
        name = str(crd["metadata"]["name"])  # type: ignore[index]
        kube.request(
            "PATCH",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
            crd,
            params={"fieldManager": "tests", "force": "true"},
            content_type="application/apply-patch+yaml",
            timeout=60,
        )
        names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            got = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (got.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout}s")
            time.sleep(0.2)
    return names
