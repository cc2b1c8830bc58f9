"""The bytes of a model's files, and whether the job's download cache can hold them.

A model read from its files (the hub's listing, a claim's folder) knows its bytes; a catalogue
model is counted: its parameters times the bytes of its published dtype. The plan records the
number (`status.plan.modelBytes`), which sizes each pod's cache claim, and a requested
`model.cache.size` that cannot hold the files is refused here, before any GPU is taken.
"""

from __future__ import annotations

from finetune_operator.api.model_cache import too_small
from finetune_operator.api.model_uri import is_hub_uri
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.plan.errors import UnsupportedSettingError
from finetune_operator.plan.workload import Workload

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def model_bytes(workload: Workload) -> int:
    """Bytes of the files a pod downloads: read from the files when known, else parameters × dtype."""
    source = workload.source
    if source.weight_bytes is not None:
        return source.weight_bytes
    dtype = str(source.config.get("torch_dtype") or source.config.get("dtype") or "bfloat16")
    return workload.shape.total_params * DTYPE_BYTES.get(dtype, 2)


def check_model_cache(spec: FineTuneJobSpec, size_bytes: int) -> None:
    """A hub model's requested per-pod cache must hold its files (a shared claim is checked by the operator)."""
    cache = spec.model.cache
    if not is_hub_uri(spec.model.uri) or cache is None or cache.size is None or cache.claim_name is not None:
        return
    why = too_small(str(cache.size), size_bytes, spec.model.uri)
    if why is not None:
        raise UnsupportedSettingError(why)
