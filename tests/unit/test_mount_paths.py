"""`deepspeed.nvmePath` never shadows the container's system directories or the operator's mounts,
and `ftjob validate` (pydantic) and the apiserver (CEL) agree path by path."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from finetune_operator.api import FineTuneJob, mount_paths
from finetune_operator.api.errors import describe
from tests.crd_schema import ApiserverEmulation
from tests.factories import job_document

ALLOWED = ["/mnt/nvme", "/local_nvme", "/scratch/", "/var/tmp/ds", "/opt/nvme", "/nvme0/offload", "/mnt/pvcx"]
REFUSED = [
    "/",
    "//",
    "/usr",
    "/usr/local/nvme",
    "/dev/shm",
    "/etc/ftjob",
    "/etc",
    "/mnt",
    "/mnt/",
    "/mnt/pvc",
    "/mnt/pvc/out",
    "/var",
    "/var/cache",
    "/var/cache/ftjob/x",
    "/opt",
    "/opt/ftjob",
    "/a/../usr",
    "/a/./b",
    "/a//b",
    "/proc/1",
]


def _doc(path: str) -> dict[str, Any]:
    return job_document(deepspeed={"offloadOptimizer": "nvme", "nvmePath": path})


@pytest.mark.parametrize("path", ALLOWED + REFUSED)
def test_validate_and_apiserver_agree(path: str) -> None:
    expected_ok = path in ALLOWED
    assert (mount_paths.problem(path) is None) == expected_ok
    try:
        FineTuneJob.from_manifest(_doc(path))
        lines: list[str] = []
    except ValidationError as exc:
        lines = describe(exc, FineTuneJob)
    apiserver = ApiserverEmulation().problems(_doc(path))
    if expected_ok:
        assert lines == [] and apiserver == [], (lines, apiserver)
    else:
        assert any(line.startswith("spec.deepspeed.nvmePath: nvmePath must be a dedicated directory") for line in lines)
        assert any("nvmePath must be a dedicated directory" in p for p in apiserver), apiserver
