"""The analytical memory model: DeepSpeed's own estimators and the properties it must keep."""

from __future__ import annotations

import os
from typing import Any

import pytest

from finetune_operator.api.loss_chunks import HIDDEN_COPIES
from finetune_operator.api.strategy import Strategy
from finetune_operator.plan.search.activations import PACKED_CPU_ATTENTION_BYTES_PER_SCORE, activation_bytes
from finetune_operator.plan.search.memory import estimate_memory
from finetune_operator.plan.search.planner import plan_job
from finetune_operator.plan.workload import Workload, workload_from_spec
from tests.factories import make_job

FULL_MODELS = ["llama-2-7b", "llama-3.1-70b", "mixtral-8x7b", "qwen2.5-14b", "phi-3-mini"]


def workload(arch: str, method: str = "full", nodes: int = 1, gpus: int = 8, seq: int = 2048) -> Workload:
    job = make_job(
        model={"uri": "org/model", "architecture": arch},
        method={"type": method},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": seq},
        resources={"numNodes": nodes, "gpusPerNode": gpus},
        training={"globalBatchSize": max(32, nodes * gpus)},  # a multiple of the world size
    )
    return workload_from_spec(job.spec)


def strategy(stage: int, optimizer: str = "none", params: str = "none", ckpt: bool = False, micro: int = 1) -> Strategy:
    return Strategy(
        zero_stage=stage,
        offload_optimizer=optimizer,
        offload_params=params,
        gradient_checkpointing=ckpt,
        micro_batch_size=micro,
        gradient_accumulation_steps=1,
    )


@pytest.fixture(scope="module")
def deepspeed_estimators() -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    # The `_all_cold` entry points print tables built from these two functions.
    return stage_1_and_2.estimate_zero2_model_states_mem_needs, stage3.estimate_zero3_model_states_mem_needs


@pytest.mark.parametrize("arch", FULL_MODELS)
@pytest.mark.parametrize(("nodes", "gpus"), [(1, 1), (1, 8), (4, 8)])
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_model_states_agree_with_deepspeed(
    deepspeed_estimators: Any, arch: str, nodes: int, gpus: int, offload: bool
) -> None:
    zero2, _ = deepspeed_estimators
    w = workload(arch, nodes=nodes, gpus=gpus)
    _, expected = zero2(w.counts.total, gpus, nodes, cpu_offload=offload)
    ours = estimate_memory(w, strategy(2, "cpu" if offload else "none")).model_state_bytes
    assert ours == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("arch", FULL_MODELS)
@pytest.mark.parametrize(("nodes", "gpus"), [(1, 8), (4, 8), (16, 8)])
@pytest.mark.parametrize(("optimizer", "params"), [("none", "none"), ("cpu", "none"), ("cpu", "cpu")])
def test_zero3_model_states_agree_with_deepspeed(
    deepspeed_estimators: Any, arch: str, nodes: int, gpus: int, optimizer: str, params: str
) -> None:
    _, zero3 = deepspeed_estimators
    w = workload(arch, nodes=nodes, gpus=gpus)
    _, expected, _ = zero3(
        w.counts.total,
        w.counts.largest_layer,
        gpus,
        nodes,
        cpu_offload=optimizer != "none",
        cpu_offload_params=params != "none",
    )
    estimate = estimate_memory(w, strategy(3, optimizer, params))
    gathered_layer = 2 * w.param_bytes * w.counts.largest_layer
    assert estimate.model_state_bytes + gathered_layer == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("arch", ["llama-2-7b", "llama-3.1-70b", "mixtral-8x7b"])
def test_more_gpus_never_increase_zero3_bytes_per_gpu(method: str, arch: str) -> None:
    sizes = [estimate_memory(workload(arch, method, nodes=n), strategy(3)).per_gpu_bytes for n in (1, 2, 4, 8, 16)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] < sizes[0]


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offload_never_increases_gpu_bytes(method: str, stage: int) -> None:
    w = workload("llama-3.1-8b", method)
    gpu_only = estimate_memory(w, strategy(stage)).per_gpu_bytes
    optimizer_offloaded = estimate_memory(w, strategy(stage, "cpu")).per_gpu_bytes
    assert optimizer_offloaded <= gpu_only
    if stage == 3:
        assert estimate_memory(w, strategy(3, "cpu", "cpu")).per_gpu_bytes < optimizer_offloaded


@pytest.mark.parametrize("arch", ["llama-2-7b", "gemma-2-9b", "mixtral-8x7b", "phi-3-mini", "qwen2.5-7b"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_checkpointing_reduces_activations(arch: str, method: str) -> None:
    w = workload(arch, method, seq=4096)
    for micro in (1, 4):
        plain = activation_bytes(w, micro, checkpointing=False).activations
        checkpointed = activation_bytes(w, micro, checkpointing=True).activations
        assert checkpointed < plain / 3


def test_activations_grow_linearly_with_micro_batch() -> None:
    w = workload("llama-2-7b", "lora")
    one, four = (activation_bytes(w, m, checkpointing=False) for m in (1, 4))
    # the layers' terms are per token; what is not is the loss chunk, which `activations` is net of
    # when the final norm's backward outgrows the loss (the peak is one or the other)
    assert four.activations == pytest.approx(4 * one.activations, rel=0.01)
    # the loss runs in chunks: only the trained tokens' hidden states grow with the batch
    chunk = one.logits - HIDDEN_COPIES * 2 * w.shape.hidden_size * w.seq_len
    assert four.logits == chunk + 4 * HIDDEN_COPIES * 2 * w.shape.hidden_size * w.seq_len


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_the_logits_term_of_an_8b_job_at_2x2048_is_under_a_gib(method: str) -> None:
    w = workload("llama-3.1-8b", method, gpus=1)
    logits = activation_bytes(w, 2, checkpointing=True).logits
    head_gradient = 2 * w.shape.vocab_size * w.shape.hidden_size if method == "full" else 0
    assert logits - head_gradient < 2**30
    # the full-logits path it replaced held 12 bytes per vocabulary entry per token: 5.9 GiB
    assert logits - head_gradient < 12 * w.shape.vocab_size * 2 * 2048 / 5


def test_soft_capped_heads_keep_the_full_logits_term() -> None:
    w = workload("gemma-2-9b", "lora")
    logits = activation_bytes(w, 1, checkpointing=True).logits
    assert logits >= 14 * w.shape.vocab_size * w.seq_len


def test_qlora_stores_the_base_in_about_half_a_byte_per_parameter() -> None:
    lora, qlora = workload("llama-2-7b", "lora", gpus=1), workload("llama-2-7b", "qlora", gpus=1)
    lora_weights = estimate_memory(lora, strategy(0)).breakdown["weights"]
    qlora_weights = estimate_memory(qlora, strategy(0)).breakdown["weights"]
    assert 0.25 < qlora_weights / lora_weights < 0.30


def test_lora_optimizer_state_is_a_small_fraction_of_full() -> None:
    full = estimate_memory(workload("llama-2-7b", "full"), strategy(2)).breakdown["optimizer_states"]
    lora = estimate_memory(workload("llama-2-7b", "lora"), strategy(2)).breakdown["optimizer_states"]
    assert lora < full / 100


def test_breakdown_keys_are_the_status_fields() -> None:
    from finetune_operator.api.status import MemoryBreakdown

    estimate = estimate_memory(workload("llama-2-7b"), strategy(2))
    assert set(estimate.breakdown) == set(MemoryBreakdown.model_fields)
    assert estimate.per_gpu_bytes == sum(estimate.breakdown.values())


def test_optimizer_offload_moves_states_to_the_host() -> None:
    w = workload("llama-2-7b", "full")
    on_gpu, offloaded = estimate_memory(w, strategy(2)), estimate_memory(w, strategy(2, "cpu"))
    assert offloaded.breakdown["optimizer_states"] == 0
    gpus_per_node = w.ranks_per_node
    moved = on_gpu.breakdown["optimizer_states"] * gpus_per_node
    assert offloaded.host_bytes_per_node - on_gpu.host_bytes_per_node >= moved


def _tiny_cpu(**spec: Any) -> Workload:
    base: dict[str, Any] = {
        "model": {"uri": "builtin://tiny-llama"},
        "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": 512},
        "method": {"type": "lora"},
        "training": {"precision": "bf16"},
        "resources": {"numNodes": 2, "gpusPerNode": 0},
    }
    for key, value in spec.items():
        base[key] = {**base[key], **value}
    return workload_from_spec(make_job(**base).spec)


@pytest.mark.parametrize(("precision", "param_bytes"), [("bf16", 2), ("fp16", 2), ("fp32", 4)])
def test_a_cpu_rank_is_planned_in_the_precision_it_computes_in(precision: str, param_bytes: int) -> None:
    """The trainer keeps the job's precision on CPU (fp16 becomes bf16 where the CPU has no fp16:
    the same two bytes), with DeepSpeed's fp32 masters beside 16-bit weights, as on a GPU."""
    cpu = _tiny_cpu(training={"precision": precision})
    gpu = _tiny_cpu(training={"precision": precision}, resources={"gpusPerNode": 1})
    mixed = precision != "fp32"
    assert (cpu.param_bytes, cpu.mixed_precision, cpu.on_cpu) == (param_bytes, mixed, True)
    assert (gpu.param_bytes, gpu.mixed_precision, gpu.on_cpu) == (param_bytes, mixed, False)


def test_packing_on_cpu_adds_the_mask_and_the_masked_attention_and_on_gpu_masks_like_padding() -> None:
    micro, seq = 8, 512
    off = activation_bytes(_tiny_cpu(), micro, checkpointing=False)
    on = activation_bytes(_tiny_cpu(dataset={"packing": True}), micro, checkpointing=False)
    assert on.logits == off.logits
    layers, heads = 4, 4  # tiny-llama
    # the mask once, and each layer's masked attention (its fp32 mask copy and kernel high-water, fitted)
    per_score = PACKED_CPU_ATTENTION_BYTES_PER_SCORE
    assert on.activations - off.activations == 16 * micro * seq * seq + layers * per_score * heads * micro * seq * seq
    gpu_off = activation_bytes(_tiny_cpu(resources={"gpusPerNode": 1}), micro, checkpointing=False)
    gpu_on = activation_bytes(_tiny_cpu(resources={"gpusPerNode": 1}, dataset={"packing": True}), micro, False)
    # no varlen kernel in the image: packed rows give each layer's SDPA an additive copy of their
    # block-diagonal mask (16-bit on GPU), as padded rows do of theirs
    assert gpu_on.logits == gpu_off.logits
    assert gpu_on.activations == gpu_off.activations
    gpu_off_ckpt = activation_bytes(_tiny_cpu(resources={"gpusPerNode": 1}), micro, checkpointing=True)
    gpu_on_ckpt = activation_bytes(_tiny_cpu(resources={"gpusPerNode": 1}, dataset={"packing": True}), micro, True)
    assert gpu_on_ckpt.activations == gpu_off_ckpt.activations  # the boolean mask every recompute reads


def test_qlora_under_zero3_counts_loading_the_whole_4bit_model_on_each_gpu() -> None:
    """bitsandbytes quantises whole tensors, so a QLoRA model loads whole on every GPU before
    DeepSpeed partitions it: for 70B on 8 GPUs that is far above the partitioned step."""
    w = workload("llama-3.1-70b", "qlora", gpus=8, seq=1024)
    zero3, zero2 = estimate_memory(w, strategy(3, ckpt=True)), estimate_memory(w, strategy(2, ckpt=True))
    counts = w.counts
    expected = int(counts.quantizable * w.quantized_bytes_per_param) + 2 * (counts.frozen - counts.quantizable)
    assert zero3.load_peak_bytes == expected + int(w.overhead_bytes)
    assert 36 * 2**30 < zero3.load_peak_bytes < 42 * 2**30  # ~35 GiB of 4-bit weights, 2 GiB of bf16 embeddings
    assert zero3.step_bytes < zero3.load_peak_bytes == zero3.per_gpu_bytes
    assert zero2.load_peak_bytes == 0 and zero2.per_gpu_bytes == zero2.step_bytes  # the step holds the whole model
    lora3 = estimate_memory(workload("llama-3.1-70b", "lora", gpus=8, seq=1024), strategy(3, ckpt=True))
    assert lora3.load_peak_bytes == 0  # LoRA loads partitioned (zero.Init)


def test_a_qlora_70b_on_40gib_gpus_is_not_planned_at_zero3_below_its_loading_peak() -> None:
    job = make_job(
        model={"uri": "org/model", "architecture": "llama-3.1-70b"},
        method={"type": "qlora"},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": 1024},
        resources={"numNodes": 1, "gpusPerNode": 8, "gpuMemory": "40Gi"},
        training={"globalBatchSize": 32, "precision": "bf16"},
    )
    result = plan_job(job.spec, require_fit=False)
    zero3 = [c for c in result.candidates if c.strategy.zero_stage == 3 and c.strategy.offload_params == "none"]
    assert zero3 and not any(c.fits_gpu for c in zero3)
    step_fits = [c for c in zero3 if c.memory.step_bytes <= result.gpu_budget_bytes]
    assert step_fits and all("at load (the whole 4-bit model" in c.reason for c in step_fits)
    assert result.chosen is None
    assert any("a QLoRA model loads whole on every GPU" in line for line in result.suggestions), result.suggestions
