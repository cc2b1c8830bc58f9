"""How much local scratch a pod needs when the job's output is on object storage.

With `output.uri: s3://...` each pod writes its part of a checkpoint to a local emptyDir and
uploads it (see the trainer's `s3_checkpoints`); the scratch is freed once the checkpoint is
committed, so it holds one checkpoint's share at a time, plus the final export on node 0.
The sizes are estimates from the plan's trainable-parameter count, with a margin: the emptyDir's
limit and the pod's ephemeral-storage request, so the kubelet places and keeps the pod.

- LoRA / QLoRA: the consolidated trainable state (fp32 value and two Adam moments: 12 bytes a
  parameter) and the exported adapter (4 bytes a parameter); a merged model adds the base
  weights in 16 bits.
- Full fine-tuning: a pod's share of DeepSpeed's shards (fp32 master and moments, 12 bytes a
  parameter, split over the nodes), the 16-bit model states (2 bytes) and the exported model
  (2 bytes) on node 0.
"""

from __future__ import annotations

from ..api.spec import FineTuneJobSpec
from ..api.status import PlanStatus
from ..api.storage_uri import is_s3

GIB = 2**30
MARGIN = 1.25
FLOOR_BYTES = 2 * GIB
"""Logs, RNG files, the tokenizer and small models generated in code fit in this."""


def base_weight_bytes_16bit(plan: PlanStatus, spec: FineTuneJobSpec) -> int:
    """The base model's weights in 16 bits, from the plan's per-GPU weight bytes."""
    per_gpu = plan.breakdown.weights
    whole = per_gpu * spec.world_size if plan.zero_stage == 3 else per_gpu
    return whole * 4 if spec.method.traits.base_quantized else whole  # 4-bit -> 16-bit


def scratch_bytes(spec: FineTuneJobSpec, plan: PlanStatus) -> int:
    """The scratch emptyDir of one pod, in bytes rounded up to GiB (0: output not on s3://)."""
    if not is_s3(spec.output.uri):
        return 0
    trainable = plan.trainable_parameters or 0
    if spec.method.traits.base_trains:
        need = trainable * (12 / spec.resources.num_nodes + 2 + 2)
    else:
        need = trainable * 16
        if spec.output.merged_model:
            need += base_weight_bytes_16bit(plan, spec)
    total = max(FLOOR_BYTES, int(need * MARGIN))
    return -(-total // GIB) * GIB
