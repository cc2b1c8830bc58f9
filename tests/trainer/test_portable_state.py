"""The portable LoRA checkpoint holds the trainable state only: adapter plus Adam moments.

On a real tiny LoRA model (one AdamW step, no ZeRO: the plain-tensor path of `portable`)
the saved file is exactly the trainable parameters and their two moments in fp32, and
loading it into a fresh model and optimizer restores weights, moments, step count and
learning rate. The same layout applied to an 8B-shaped Llama built on the meta device
gives the size of its checkpoint, next to the frozen base that DeepSpeed's own format
wrote with every save.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_trainer.checkpoint import portable

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

PICKLE_OVERHEAD = 64 * 1024
"""torch.save's zip container, tensor names and the scheduler state: bounded, independent of model size."""


def _engine(model_dir: Path, lr: float = 0.01) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from finetune_trainer.rank.schedule import lr_lambda

    base = LlamaForCausalLM.from_pretrained(model_dir)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", 2, 10))
    return SimpleNamespace(module=model, optimizer=optimizer, lr_scheduler=scheduler)


def _train_steps(engine: Any, steps: int) -> None:
    import torch

    ids = torch.arange(1, 33).reshape(2, 16)
    for _ in range(steps):
        loss = engine.module(input_ids=ids, labels=ids).loss
        loss.backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad()
        engine.lr_scheduler.step()


def _trainable_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_checkpoint_is_the_trainable_state_and_loads_into_a_fresh_engine(tmp_path: Path, tiny_model_dir: Path) -> None:
    import torch

    engine = _engine(tiny_model_dir)
    _train_steps(engine, 3)
    portable.save(engine, tmp_path, rank=0)
    saved = torch.load(tmp_path / portable.TRAINABLE_FILE, weights_only=True)
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert set(saved["params"]) == trainable and all("lora_" in n for n in trainable)
    assert saved["optimizer_step"] == 3
    count = _trainable_count(engine.module)
    tensor_bytes = 3 * 4 * count  # fp32 weight + exp_avg + exp_avg_sq per trainable parameter
    assert portable.size_bytes(saved) == tensor_bytes
    file_bytes = (tmp_path / portable.TRAINABLE_FILE).stat().st_size
    assert tensor_bytes <= file_bytes <= tensor_bytes + PICKLE_OVERHEAD, (file_bytes, tensor_bytes)

    fresh = _engine(tiny_model_dir, lr=0.01)
    portable.load(fresh, tmp_path)
    for (name, old), new in zip(engine.module.named_parameters(), fresh.module.parameters(), strict=True):
        assert torch.equal(old, new), name
        if old.requires_grad:
            for key in portable.MOMENTS:
                assert torch.equal(engine.optimizer.state[old][key], fresh.optimizer.state[new][key]), (name, key)
            assert int(fresh.optimizer.state[new]["step"]) == 3
    assert fresh.lr_scheduler.get_last_lr() == engine.lr_scheduler.get_last_lr()
    assert fresh.optimizer.param_groups[0]["lr"] == engine.optimizer.param_groups[0]["lr"]
    _train_steps(engine, 1)
    _train_steps(fresh, 1)
    for old, new in zip(engine.module.parameters(), fresh.module.parameters(), strict=True):
        assert torch.equal(old, new)  # the next update is the same: moments, step count and LR were restored


def test_an_8b_lora_checkpoint_is_adapter_plus_optimizer_state() -> None:
    from finetune_operator.plan.counting.meta_count import apply_lora, build_meta_model
    from finetune_operator.plan.sources.model_source import catalogue_entry

    model = apply_lora(build_meta_model(catalogue_entry("llama-3.1-8b").config), 16, ["all-linear"])
    trainable = _trainable_count(model)
    base = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    adapter_bytes = 4 * trainable  # fp32 master of each LoRA weight
    optimizer_bytes = 2 * 4 * trainable  # Adam's two fp32 moments
    checkpoint_bytes = 3 * 4 * trainable + PICKLE_OVERHEAD  # the layout the test above verifies on disk
    frozen_bytes = 2 * base  # the bf16 base DeepSpeed's own format saved at ZeRO 0-2
    print(
        f"\nLlama-3.1-8B, LoRA r=16 all-linear: {trainable:,} trainable of {base:,}; "
        f"checkpoint {checkpoint_bytes / 2**20:.0f} MiB (adapter {adapter_bytes / 2**20:.0f} MiB + "
        f"optimizer {optimizer_bytes / 2**20:.0f} MiB) vs {frozen_bytes / 2**30:.1f} GiB of frozen base"
    )
    assert 40_000_000 < trainable < 45_000_000  # 41.9M: 16 x (in + out) of every linear layer
    assert checkpoint_bytes <= adapter_bytes + optimizer_bytes + PICKLE_OVERHEAD
    assert checkpoint_bytes < frozen_bytes / 30


STRATEGY = {
    "zeroStage": 2,
    "offloadOptimizer": "none",
    "offloadParams": "none",
    "microBatchSize": 2,
    "gradientAccumulationSteps": 2,
    "worldSize": 2,
}


@pytest.mark.parametrize(
    ("change", "converted", "refused"),
    [
        ({"zeroStage": 3}, True, None),
        ({"zeroStage": 1}, True, None),
        ({"worldSize": 1, "gradientAccumulationSteps": 4}, True, None),
        ({"zeroStage": 3, "offloadOptimizer": "cpu", "offloadParams": "cpu"}, True, None),
        ({"microBatchSize": 1, "gradientAccumulationSteps": 4}, False, None),  # same shards: DeepSpeed loads them
        ({"offloadOptimizer": "cpu"}, False, None),
        ({}, False, None),
        ({"zeroStage": 0}, None, "deepspeed.zeroStage: a ZeRO-0 checkpoint cannot be converted"),
        ({"zeroStage": 3, "offloadOptimizer": "nvme"}, None, "deepspeed.offloadOptimizer/offloadParams"),
    ],
)
def test_full_fine_tuning_converts_shards_of_another_zero_stage_or_world_size(
    tmp_path: Path, change: dict[str, Any], converted: bool | None, refused: str | None
) -> None:
    """Before, DeepSpeed's bare `assert len(self.ckpt_list) > 0` failed every gang restart; now the
    shards are converted where the sharding changed, and the pairs that cannot be are refused by name."""
    from finetune_operator.api.pod_contract import CheckpointState
    from finetune_operator.api.strategy import Strategy
    from finetune_trainer.checkpoint import saves
    from finetune_trainer.settings import ConfigError

    state = CheckpointState.from_file(
        json.dumps({"globalStep": 3, "strategy": STRATEGY, "checkpointFormat": "deepspeed"})
    )
    found = saves.Found(tmp_path / "step-00000003", 3, state)
    now = Strategy.from_wire({**STRATEGY, **change})
    if refused is None:
        assert saves.check_deepspeed_resume(found, now) is converted
        return
    with pytest.raises(ConfigError) as info:
        saves.check_deepspeed_resume(found, now)
    message = str(info.value)
    assert refused in message and "written by ZeRO-2, micro-batch 2 x accumulation 2 x world 2" in message


def test_zero_0_keeps_its_whole_checkpoint_on_another_world_size(tmp_path: Path) -> None:
    """ZeRO-0 shards nothing: its checkpoint is whole, so DeepSpeed loads it on any world size."""
    from finetune_operator.api.pod_contract import CheckpointState
    from finetune_operator.api.strategy import Strategy
    from finetune_trainer.checkpoint import saves

    saved = {**STRATEGY, "zeroStage": 0}
    state = CheckpointState.from_file(json.dumps({"globalStep": 3, "strategy": saved, "checkpointFormat": "deepspeed"}))
    found = saves.Found(tmp_path / "step-00000003", 3, state)
    now = Strategy.from_wire({**saved, "worldSize": 1, "gradientAccumulationSteps": 4})
    assert saves.check_deepspeed_resume(found, now) is False


def test_a_failed_conversion_names_the_checkpoint_and_leaves_it_alone(tmp_path: Path) -> None:
    """Shards that `ds_to_universal` cannot read: a `TrainingError` naming the checkpoint on every
    rank, no half-written universal folder, and the checkpoint's files untouched."""
    from finetune_trainer.checkpoint import universal

    source = tmp_path / "checkpoints" / "step-00000003"
    source.mkdir(parents=True)
    (source / "mp_rank_00_model_states.pt").write_bytes(b"not a checkpoint")
    (source / "trainer_state.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in source.iterdir()}

    with pytest.raises(universal.ConversionError) as info:
        universal.ensure(source, SimpleNamespace(rank=0, sum=lambda values: values))
    message = str(info.value)
    assert f"could not convert checkpoint {source}" in message and "optim_states" in message, message
    assert "the checkpoint itself is unchanged" in message
    assert sorted(p.name for p in source.parent.iterdir()) == ["step-00000003"]  # no .tmp-, no _universal
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before

    with pytest.raises(universal.ConversionError, match="see rank 0"):  # another rank learns of it too
        universal.ensure(source, SimpleNamespace(rank=1, sum=lambda values: [1.0]))
