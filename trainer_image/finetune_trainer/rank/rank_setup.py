"""What one rank builds before its first step, each piece returned to `Trainer.setup`.

Every builder here takes what it reads as arguments and returns what it builds (a frozen
dataclass where several values belong together); none stores anything on the trainer, so
`Trainer.setup` is the one place that shows what the loop holds and in what order the ranks
build it (the order matters: the model's random initialisation follows the seed set after
the data is read, and resuming compares weights exactly).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api.methods import ReferenceModel
from finetune_operator.api.spec import DatasetFormat, FineTuneJobSpec
from finetune_operator.api.status import PlanStatus
from finetune_trainer.data import prepared
from finetune_trainer.data.batching import EpochSampler, Row, example_rows
from finetune_trainer.data.formats import preference_parts, prompt_and_answer
from finetune_trainer.data.loading import DataError
from finetune_trainer.model import modeling
from finetune_trainer.rank.schedule import lr_lambda
from finetune_trainer.settings import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingData:
    """The sequences this run trains on, which of them each step reads, and how many steps it takes."""

    rows: Sequence[Row]
    sampler: EpochSampler
    total_steps: int
    skipped_records: int
    """Malformed records left out (training and validation files together), for the summary."""
    rows_per_example: int = 1
    """2 for preference pairs: the sampler deals examples, each two rows (`batching.example_rows`)."""

    def batch_rows(self, examples: Sequence[int]) -> list[Row]:
        """The rows of one micro-batch of examples (chosen first, then rejected, for pairs)."""
        return example_rows(self.rows, examples, self.rows_per_example)


@dataclass(frozen=True)
class HeldOut:
    """What evaluation reads: the validation rows and, for a built-in task, exact-match prompts."""

    rows: Sequence[Row]
    prompts: list[list[int]]
    answers: list[str]


@dataclass(frozen=True)
class ParameterSummary:
    """The loaded model's parameter counts (ZeRO-3's full sizes) and what LoRA all-linear left frozen."""

    trainable: int
    total: int
    lora_skipped: list[str]


def fetch_model(spec: FineTuneJobSpec, cache: Path, local_rank: int, barrier: Callable[[], None]) -> str:
    """The model's local path: the node's first rank fetches it while the others wait, then each resolves it."""
    if local_rank == 0:
        modeling.model_path(spec.model.uri, cache, spec.training.seed)
    barrier()
    return modeling.model_path(spec.model.uri, cache, spec.training.seed)


def load_data(
    spec: FineTuneJobSpec, plan: PlanStatus, tokenizer: Any, dist: Any, *, local_rank: int, cache_root: Path
) -> tuple[TrainingData, HeldOut]:
    """The dataset (and the validation file, if any) tokenised, split and packed once per node
    (see `data.prepared`: local rank 0 builds it, the node's other ranks memory-map it), and the
    steps planned. `dist` is the run's collective (`rank`, `world`, `sum`)."""
    if spec.reference == ReferenceModel.PRECOMPUTED:
        raise ConfigError(
            "method.preference.precomputeReference: precomputed reference log-probabilities are planned but not "
            "trained by this trainer yet; leave it unset (dpo with preference.base full holds a frozen copy)"
        )
    data = prepared.prepare(prepared.DataSettings.of(spec), tokenizer, cache_root, local_rank)
    tokenising = round(dist.sum([float(data.tokenized)])[0])
    if dist.rank == 0:
        log.info("dataset tokenised by %d of %d ranks, read from %s", tokenising, dist.world, data.folder)
        for warning in data.warnings:
            log.warning("%s", warning)
    prompts: list[list[int]] = []
    answers: list[str] = []
    for record in data.demo_records:  # a built-in task's held-out prompts (a preference pair's: is chosen said?)
        prompt, answer = exact_match_prompt(record, spec.dataset.format, tokenizer)
        prompts.append(prompt)
        answers.append(answer)
    examples = len(data.rows) // data.rows_per_example
    sampler = EpochSampler(
        examples, dist.world, plan.micro_batch_size, plan.gradient_accumulation_steps, spec.training.seed
    )
    if sampler.steps_per_epoch == 0:
        raise DataError(
            f"{spec.dataset.uri}: {examples} training examples do not fill one optimizer step of "
            f"{sampler.per_step} (globalBatchSize); add data or lower the batch size"
        )
    t = spec.training
    if t.max_steps is not None:
        total_steps = t.max_steps
    else:
        total_steps = max(1, math.ceil((t.epochs or 1.0) * sampler.steps_per_epoch))
    return (
        TrainingData(
            rows=data.rows,
            sampler=sampler,
            total_steps=total_steps,
            skipped_records=data.skipped,
            rows_per_example=data.rows_per_example,
        ),
        HeldOut(rows=data.val_rows, prompts=prompts, answers=answers),
    )


def exact_match_prompt(record: dict[str, Any], fmt: DatasetFormat, tokenizer: Any) -> tuple[list[int], str]:
    """A held-out record as (the prompt's token ids, the answer expected after it: for a preference
    pair, the chosen one)."""
    if fmt == DatasetFormat.PREFERENCE:
        prompt, chosen, _ = preference_parts(record)
        if isinstance(prompt, str):  # as the pair's rows begin: the BOS token's text, then the prompt
            return list(tokenizer((tokenizer.bos_token or "") + prompt, add_special_tokens=False)["input_ids"]), chosen
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        said = [turn["content"] for turn in chosen if turn["role"] == "assistant"]
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), str(said[-1])
    if fmt == DatasetFormat.MESSAGES:
        turns = record["messages"]
        text = tokenizer.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), str(turns[-1]["content"])
    prompt, answer = prompt_and_answer(record)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids], answer


def summarize_parameters(model: Any, spec: FineTuneJobSpec) -> ParameterSummary:
    """What the metrics, the setup log line and the summary say about the loaded model."""
    lora_skipped = modeling.lora_skipped(model, spec)
    trainable, total = modeling.trainable_parameters(model)
    return ParameterSummary(trainable=trainable, total=total, lora_skipped=lora_skipped)


def client_optimizer(params: list[Any], *, spec: FineTuneJobSpec, plan: PlanStatus, on_gpu: bool) -> Any:
    """The optimizer `build_engine` hands DeepSpeed: torch's fused AdamW, or DeepSpeed's CPU Adam
    when a GPU run offloads the optimizer."""
    import torch

    if on_gpu and plan.offload_optimizer != "none":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(
            params, lr=spec.training.learning_rate, weight_decay=spec.training.weight_decay, adamw_mode=True
        )
    training = spec.training
    return torch.optim.AdamW(params, lr=training.learning_rate, weight_decay=training.weight_decay, fused=True)


def build_engine(
    model: Any,
    *,
    spec: FineTuneJobSpec,
    plan: PlanStatus,
    ds_config: dict[str, Any],
    total_steps: int,
    on_gpu: bool,
) -> Any:
    """The DeepSpeed engine over `model`'s trainable parameters, with the client optimizer and
    the warmup + decay schedule it steps at each accumulation boundary.

    The client AdamW is torch's fused one, on GPU and CPU alike. torch's default there differs
    by device, and both defaults allocate temporaries the size of what they step: the
    multi-tensor one (CUDA's default) one fp32 copy of every parameter it updates, the
    single-tensor one (the CPU's) two per tensor. On the first GPU run that put a full
    fine-tune's step 16 % above its plan (1B at ZeRO-0: one fp32 copy of its 1.24B parameters
    is 4.6 GiB; the plan has no such term), and the same step runs at `deepspeed.initialize`,
    which initialises the optimizer states. The fused step allocates nothing beyond the
    states (`benchmarks/optimizer_step_memory.py`)."""
    import torch

    from finetune_trainer.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()  # without its CPU shm op, whoever set up the process group

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = client_optimizer(params, spec=spec, plan=plan, on_gpu=on_gpu)
    warmup = spec.training.warmup_steps_of(total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(str(spec.training.lr_schedule), warmup, total_steps)
    )
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    return engine


def reference_config(ds_config: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config of a frozen reference model: the policy's precision and batch shape, no
    optimizer or scheduler; under ZeRO-3 partitioned like the policy (its parameter offload too),
    otherwise whole on each rank (stage 0: ZeRO 1-2 partition only what a reference does not have)."""
    config = {k: v for k, v in ds_config.items() if k not in ("optimizer", "scheduler")}
    zero = dict(config.get("zero_optimization") or {})
    if zero.get("stage") == 3:
        zero.pop("offload_optimizer", None)
        config["zero_optimization"] = zero
    else:
        config["zero_optimization"] = {"stage": 0}
    return config


def build_reference_engine(model: Any, ds_config: dict[str, Any]) -> Any:
    """DeepSpeed's engine over a frozen reference (`modeling.load_reference`), for forwards only."""
    from finetune_trainer.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()
    engine, _, _, _ = deepspeed.initialize(model=model, config=reference_config(ds_config))
    engine.eval()
    return engine
