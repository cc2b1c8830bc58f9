"""Whether the claims a job writes can be shared by all its pods.

All ranks write one checkpoint folder (rank 0 renames it once every rank has saved its
share), and every pod downloads into the model cache claim. A multi-node job therefore
needs ReadWriteMany claims: on the usual ReadWriteOnce block volume the second pod hangs in
ContainerCreating (Multi-Attach), the first times out after 30 minutes, and the job burns
its restarts without saying why. The reconciler reads the claims' access modes through the
API and hands them in; this check stays pure.

An output on object storage (`s3://`) is no claim: each pod stages its part of a checkpoint on
its own scratch volume and uploads it, so such a job writes no shared claim at all (unless its
model cache is one).
"""

from __future__ import annotations

from collections.abc import Mapping

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.storage_uri import Scheme, StorageUri
from finetune_operator.plan.errors import PlanningError


class SharedStorageError(PlanningError):
    """A claim the pods of a multi-node job all write is not ReadWriteMany (Failed/InvalidSpec)."""


def written_claims(spec: FineTuneJobSpec) -> dict[str, str]:
    """Claim name → the spec field that names it, for the claims every pod writes."""
    out: dict[str, str] = {}
    output = StorageUri.of(spec.output.uri)
    if output.scheme is Scheme.CLAIM:
        out[output.claim] = "spec.output.uri"
    cache = spec.model.cache
    if cache is not None and cache.claim_name is not None:
        out.setdefault(cache.claim_name, "spec.model.cache.claimName")
    return out


def check_shared_storage(spec: FineTuneJobSpec, access_modes: Mapping[str, tuple[str, ...] | None]) -> None:
    """Raise SharedStorageError when numNodes > 1 and a written claim is known not to be ReadWriteMany.

    `access_modes` maps a claim to its access modes (the bound volume's, else the requested
    ones); a claim that is absent or None (not found yet) is not judged here.
    """
    nodes = spec.resources.num_nodes
    if nodes <= 1:
        return
    for claim, field in sorted(written_claims(spec).items()):
        modes = access_modes.get(claim)
        if modes is not None and "ReadWriteMany" not in modes:
            raise SharedStorageError(
                f"{field}: claim {claim!r} is {', '.join(modes) or 'without access modes'}, but the "
                f"{nodes} pods of this job (resources.numNodes={nodes}) all write to it on different nodes: "
                "use a ReadWriteMany claim (NFS, CephFS, a cloud file store)"
                + (
                    ", object storage (s3://bucket/prefix: no shared claim needed)"
                    if field == "spec.output.uri"
                    else ""
                )
                + " or numNodes: 1"
            )
