"""Every generated document the apiserver admits gets a verdict from the running operator.

The same generator as the validate test; each admitted document is created for real, in
batches, and must show a state and a condition within 30 s (Planned/Running on the kwok GPU
nodes, or Failed with a reason). The operator never exits and never logs a traceback.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from finetune_localcluster import Kube, KubeError, wait_for
from finetune_localcluster.devtools import OperatorProcess
from tests.robustness.documents import generate

DOCUMENTS = 1000
BATCH = 20
VERDICT_S = 30.0


def _admitted(kube: Kube, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    path = f"/apis/finetune.dev/v1alpha1/namespaces/{namespace}/finetunejobs"
    out = []
    for index, (what, generated) in enumerate(generate(DOCUMENTS, seed=20261201)):
        doc = json.loads(json.dumps(generated))
        doc["metadata"]["name"] = f"fuzz-{index}"
        doc["metadata"]["namespace"] = namespace
        try:
            kube.request("POST", path, doc, params={"dryRun": "All", "fieldValidation": "Strict"})
        except KubeError:
            continue
        out.append((what, doc))
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_admitted_document_reaches_a_verdict_and_the_operator_survives(
    robust_kube: Kube, robust_operator: OperatorProcess
) -> None:
    namespace = "fuzz"
    robust_kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    path = f"/apis/finetune.dev/v1alpha1/namespaces/{namespace}/finetunejobs"
    admitted = _admitted(robust_kube, namespace)
    assert len(admitted) > 100, len(admitted)
    states: dict[str, int] = {}
    slow: list[str] = []
    unclear: list[str] = []
    try:
        for start in range(0, len(admitted), BATCH):
            batch = admitted[start : start + BATCH]
            created = time.monotonic()
            for _, doc in batch:
                robust_kube.request("POST", path, doc)
            for what, doc in batch:
                name = doc["metadata"]["name"]
                left = max(1.0, VERDICT_S - (time.monotonic() - created))

                def verdict(n: str = name) -> Any:
                    return (robust_kube.get(f"{path}/{n}").get("status") or {}).get("conditions") and robust_kube.get(
                        f"{path}/{n}"
                    )["status"]

                try:
                    status = wait_for(verdict, left, f"a verdict on {name}")
                except TimeoutError:
                    slow.append(f"{name} ({what})")
                    continue
                states[status.get("state", "?")] = states.get(status.get("state", "?"), 0) + 1
                failed = [c for c in status["conditions"] if c["type"] == "Failed" and c["status"] == "True"]
                if failed and not (failed[0]["reason"] == "DoesNotFit" or "spec." in failed[0]["message"]):
                    unclear.append(f"{name} ({what}): {failed[0]['reason']}: {failed[0]['message']}")
                assert robust_operator.proc is not None and robust_operator.proc.poll() is None, (
                    f"the operator exited after {name} ({what}):\n{robust_operator.log_tail()}"
                )
            robust_kube.request("DELETE", path, params={"propagationPolicy": "Background"})
    finally:
        print(f"{len(admitted)} admitted documents, verdicts: {states}")
        log = robust_operator.log_path.read_text(errors="replace")
    assert not slow, f"no verdict within {VERDICT_S:.0f} s: {slow}"
    assert not unclear, "failures that name no field:\n" + "\n".join(unclear)
    assert robust_operator.proc is not None and robust_operator.proc.poll() is None
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 : log.index("Traceback") + 3000]
