"""GPU acceptance: the planner against the trainer's own step, checkpoint and OOM report on one GPU.

Run it whenever a GPU is at hand (one card; the default `--budget-seconds` fits about 8 minutes
on an H200, model creation included); `--dry-run` runs every case on a tiny model on the CPU in
bf16 (the trainer tier runs it: tests/trainer/test_gpu_acceptance_dry_run.py). Every case is the
trainer's step: `modeling.load_model`, `loss.training_loss` (the chunked LM-head loss the
planner counts), the DeepSpeed config the operator renders, the trainer's optimizer and
scheduler, on batches the trainer's own `collate` builds (right-padded rows of several lengths,
or packed rows with their block-diagonal mask: `gpu_batches.real_batch`), then a checkpoint
saved and loaded back through `saves.save`/`saves.load` and one more step after the
load: the path of every resumed job (the checkpoint column says FAILED when a save, a load or
that step raises, or when the loaded trainable weights are not the saved ones). The steps after
the first are timed: tokens/s counts the batch's real (non-padding) tokens, and MFU divides
their model FLOPs (`gpu_batches.flops_per_token`) by the card's dense bf16 peak.

- (a) one random-init Llama-shaped model (1B layers, 128k vocabulary): full fine-tuning at
  ZeRO 0, 2 and 3, LoRA at ZeRO 0, 1 and 3, QLoRA (bitsandbytes nf4) at ZeRO 0 and 3, all bf16;
- (b) 24, 40 and 80 GiB cards emulated with `torch.cuda.set_per_process_memory_fraction`:
  the planner picks a strategy for an 8B LoRA job and it runs; its peak against the card;
- (c) a forced out-of-memory error, reported with the trainer's `OutOfMemory` root cause.

Every case, and every model's creation, runs in a process of its own (spawned on the GPU, forked
on the CPU), so nothing a case leaves behind counts in the next one's peaks or emulated card. The
first GPU run had every case in one process, and earlier cases' memory was still allocated when
later ones began: LoRA after full fine-tuning measured a 20 GiB load peak, and the forced OOM case
found 31 GiB allocated. Two holders: reference cycles the garbage collector had not yet reached,
and DeepSpeed's ZeRO-3 forward-module stack (a module-level list), which keeps the last ZeRO-3
model alive even after `gc.collect()` (seen on the CPU).

Two peaks per case, from `torch.cuda.max_memory_allocated()`: load (reset before
`load_model`, read after `deepspeed.initialize`: loading and engine set-up, against the
planner's `load_peak_bytes` where it plans one) and step (reset after the engine is built,
read after the steps). Planned bytes leave out the runtime-overhead term (the CUDA context is
not allocator memory). A case starts only while the budget leaves time for it (the longest
finished case of its section, or its model's creation); the table lists what finished and
`skipped (budget of Ns): …` lines name the rest.

    .venv/bin/python benchmarks/gpu_acceptance.py            # on a GPU machine
    .venv/bin/python benchmarks/gpu_acceptance.py --dry-run  # CPU: tiny bf16 runs of every case

Each table row is one line of `COLUMNS`, joined by " | ".
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

STARTED = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]
for extra in ("operator", "trainer_image", "benchmarks/planner_gpu", ""):
    sys.path.insert(0, str(ROOT / extra))

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
GPU_SHAPE = "llama-1b"
GPU_VOCAB = 128256
CARDS_GIB = (24, 40, 80)
EIGHT_B = "meta-llama/Llama-3.1-8B"
GIB = 2**30
DEFAULT_BUDGET_SECONDS = 420
"""Seconds from the script's start: 8 minutes on an H200 less the interpreter and imports."""
COLUMNS = (
    "section",
    "configuration",
    "planned load GiB",
    "measured load GiB",
    "planned step GiB",
    "measured step GiB",
    "step ratio",
    "tokens/s",
    "MFU",
    "checkpoint",
    "note",
)


@dataclass(frozen=True)
class Case:
    """One configuration of section (a): method, ZeRO stage, gradient checkpointing."""

    method: str
    stage: int
    ckpt: bool
    packed: bool = False

    def label(self, shape: str, seq: int, micro: int) -> str:
        rows = "packed" if self.packed else "padded"
        return f"{shape} {self.method} ZeRO-{self.stage}{' ckpt' if self.ckpt else ''} {rows} mb={micro} seq={seq} bf16"


CASES = (  # most telling first: the budget cuts from the end
    Case("full", 0, True),
    Case("lora", 0, True, packed=True),
    Case("qlora", 3, True),
    Case("full", 3, True, packed=True),
    Case("qlora", 0, True, packed=True),
    Case("lora", 3, False),
    Case("lora", 1, True),
    Case("full", 2, True),
)


@dataclass
class Budget:
    """Seconds left from `started` (`clock()` units); a task starts only if its estimate fits."""

    seconds: float
    started: float = STARTED
    clock: Callable[[], float] = time.monotonic
    skipped: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.seconds - (self.clock() - self.started)

    def allows(self, label: str, estimate: float) -> bool:
        if self.left() >= estimate:
            return True
        self.skipped.append(label)
        return False


T = TypeVar("T")
CASE_IMPORTS = ("bitsandbytes", "transformers.models.llama.modeling_llama", "finetune_trainer.checkpoint.saves")
"""Imported by every case beyond a training rank's preload (`node_launcher.CPU_PRELOAD`)."""


class CaseFailed(Exception):
    """What a case's process reported instead of its result.

    `reason` is the trainer's classification (`outcome.classify`), `summary` the error's type
    and message, `line` the trainer's one-line failure report (`outcome.failure_line`)."""

    def __init__(self, reason: str, summary: str, line: str) -> None:
        super().__init__(summary)
        self.reason, self.summary, self.line = reason, summary, line


def _case_process(send: Any, body: Callable[[], Any]) -> None:
    try:
        result: tuple[str, Any] = ("ok", body())
    except Exception as exc:
        from finetune_trainer.outcome import classify, failure_line

        result = ("error", (str(classify(exc)), f"{type(exc).__name__}: {str(exc)[:160]}", failure_line(exc, 0)))
    send.send(result)
    send.close()


def isolated(body: Callable[[], T], on_gpu: bool) -> T:
    """`body()` in a new process: its result, or `CaseFailed` with what went wrong there.

    Spawned on the GPU (CUDA cannot be used in a forked child), forked on the CPU (no second
    import of torch and DeepSpeed). A process that dies before reporting (killed, crashed)
    is a `CaseFailed` naming its exit code."""
    context = multiprocessing.get_context("spawn") if on_gpu else multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_case_process, args=(send, body))
    process.start()
    send.close()
    try:
        kind, payload = receive.recv()
    except EOFError:
        process.join()
        summary = f"the case's process exited with code {process.exitcode} before it reported"
        raise CaseFailed("ProcessDied", summary, summary) from None
    finally:
        receive.close()
    process.join()
    if kind == "ok":
        return payload  # type: ignore[no-any-return]
    raise CaseFailed(*payload)


@dataclass
class Measured:
    """What one run of the trainer's step gives: peaks (None on CPU), loss path, checkpoint outcome."""

    load_peak: int | None
    step_peak: int | None
    precision: str
    loss: str
    checkpoint: str
    tokens_per_s: float | None = None
    mfu: float | None = None


@dataclass
class Row:
    section: str
    label: str
    planned_load: int | None = None
    load: int | None = None
    planned: int | None = None
    measured: int | None = None
    checkpoint: str = "-"
    note: str = ""
    tokens_per_s: float | None = None
    mfu: float | None = None

    def cells(self) -> list[str]:
        def gib(value: int | None) -> str:
            return f"{value / GIB:.2f}" if value is not None else "-"

        ratio = f"{self.measured / self.planned:.2f}" if self.planned and self.measured else "-"
        return [
            self.section,
            self.label,
            gib(self.planned_load),
            gib(self.load),
            gib(self.planned),
            gib(self.measured),
            ratio,
            f"{self.tokens_per_s:.0f}" if self.tokens_per_s else "-",
            f"{self.mfu:.1%}" if self.mfu is not None else "-",
            self.checkpoint,
            self.note,
        ]

    def line(self) -> str:
        return " | ".join(self.cells())


@dataclass(frozen=True)
class SingleRank:
    """The `dist` the checkpoint module expects (rank, world, barrier, sum) for one process."""

    rank: int = 0
    world: int = 1

    def barrier(self) -> None:
        import torch.distributed

        torch.distributed.barrier()

    def sum(self, values: list[float]) -> list[float]:
        return list(values)


def llama_config(dims: dict[str, int], vocab: int) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "num_key_value_heads": dims["num_attention_heads"],
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        **dims,
    }


def job_spec(
    model_uri: str,
    method: str,
    stage: int | str,
    ckpt: bool,
    seq: int,
    micro: int | str,
    gpu_gib: int,
    packed: bool = False,
) -> Any:
    from finetune_operator.api.spec import FineTuneJobSpec

    auto = stage == "auto"
    return FineTuneJobSpec.from_wire(
        {
            "model": {"uri": model_uri},
            "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": seq, "packing": packed},
            "method": {"type": method},
            "training": {
                "microBatchSize": micro,
                "globalBatchSize": micro if isinstance(micro, int) else 8,
                "gradientCheckpointing": "auto" if auto else ("true" if ckpt else "false"),
                "precision": "bf16",
            },
            "resources": {"numNodes": 1, "gpusPerNode": 1, "gpuMemory": f"{gpu_gib}Gi"},
            "deepspeed": {
                "zeroStage": stage,
                **({} if auto else {"offloadOptimizer": "none", "offloadParams": "none"}),
            },
            "output": {"uri": "/tmp/out"},
        }
    )


def planned_bytes(spec: Any) -> tuple[Any, int, int | None]:
    """The status plan, its step bytes and its load peak (None where it plans none), both
    without the runtime overhead (what the allocator sees)."""
    from finetune_operator.plan import plan_job

    result = plan_job(spec, require_fit=False)
    candidate = result.chosen or result.candidates[0]
    memory = candidate.memory
    overhead = int(memory.breakdown["overhead"])
    load = int(memory.load_peak_bytes - overhead) if memory.load_peak_bytes else None
    return result.to_status(candidate), int(memory.step_bytes - overhead), load


def trainable_fingerprint(engine: Any) -> float:
    """A number that changes with any trainable weight this rank holds (ZeRO-3: its shard)."""
    import torch

    total = 0.0
    with torch.no_grad():
        for param in engine.module.parameters():
            if param.requires_grad:
                local = getattr(param, "ds_tensor", param)
                total += float(local.float().abs().sum()) + float(local.float().sum())
    return total


def train(
    model_dir: Path,
    spec: Any,
    plan: Any,
    steps: int,
    on_gpu: bool,
    ckpt_root: Path,
    card_bytes: int | None = None,
    packed: bool = False,
) -> Measured:
    """`steps` optimizer steps as the trainer takes them (the first untimed), then a checkpoint
    saved and loaded back, and one more step.

    Run it in a process of its own (`isolated`): it joins a one-rank process group and, with
    `card_bytes`, caps this process's CUDA allocator at that many bytes (an emulated card)."""
    import torch

    from benchmarks.gpu_batches import flops_per_token, parameter_count, peak_flops, real_batch
    from finetune_operator.api.methods import MethodType
    from finetune_operator.api.pod_contract import CheckpointState
    from finetune_operator.api.strategy import Strategy
    from finetune_operator.render.deepspeed_config import deepspeed_config
    from finetune_trainer.checkpoint import saves
    from finetune_trainer.deepspeed_import import import_deepspeed
    from finetune_trainer.model import modeling
    from finetune_trainer.model.loss import training_loss
    from finetune_trainer.rank.rank_setup import build_engine

    if not torch.distributed.is_initialized():
        deepspeed = import_deepspeed()  # without its CPU shm op, as the trainer's ranks
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    compute = modeling.compute_settings(spec, on_gpu)
    ds_config = modeling.effective_deepspeed_config(deepspeed_config(spec, plan), compute)
    if on_gpu:
        if card_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(card_bytes / torch.cuda.get_device_properties(0).total_memory)
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(spec.training.seed)
    model = modeling.load_model(spec, plan, str(model_dir), compute, ds_config)
    loss_fn = training_loss(model, on_gpu)
    engine = build_engine(model, spec=spec, plan=plan, ds_config=ds_config, total_steps=steps + 1, on_gpu=on_gpu)
    load_peak = step_peak = None
    if on_gpu:
        torch.cuda.synchronize()
        load_peak = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    batch = real_batch(int(model.config.vocab_size), spec.dataset.max_seq_length, plan.micro_batch_size, packed)
    inputs = {k: v.to(engine.device) for k, v in batch.items() if hasattr(v, "to")}

    def step() -> float:
        loss = None
        for _ in range(plan.gradient_accumulation_steps):
            loss = loss_fn(engine, inputs)
            engine.backward(loss)
            engine.step()
        return float(loss.detach()) if loss is not None else math.nan  # one read per step, as the trainer

    step()  # the first step allocates the optimizer state and warms the kernels: not timed
    if on_gpu:
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(steps - 1):
        step()
    if on_gpu:
        torch.cuda.synchronize()
        step_peak = int(torch.cuda.max_memory_allocated())
    tokens_per_s = mfu = None
    if steps > 1:
        elapsed = time.perf_counter() - began
        tokens_per_s = batch["useful_tokens"] * plan.gradient_accumulation_steps * (steps - 1) / elapsed
        config = model.config
        per_token = flops_per_token(
            parameter_count(engine.module),
            int(config.num_hidden_layers),
            int(config.hidden_size),
            spec.dataset.max_seq_length,
            base_trains=spec.method.adaptation == MethodType.FULL,
        )
        peak = peak_flops(torch.cuda.get_device_name()) if on_gpu else None
        mfu = tokens_per_s * per_token / peak if peak else None
    dist = SingleRank()
    strategy = Strategy.from_plan(plan, world_size=1)
    try:
        began = time.perf_counter()
        saved = trainable_fingerprint(engine)
        folder = saves.save(
            engine,
            ckpt_root,
            steps,
            CheckpointState(global_step=steps, strategy=strategy),
            rank=0,
            barrier=dist.barrier,
            portable_state=spec.method.adaptation != MethodType.FULL,
        )
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        step()  # the weights move on; loading must bring back the saved ones
        moved = trainable_fingerprint(engine) != saved
        found = saves.newest(ckpt_root)
        if found is None:
            raise RuntimeError(f"no complete checkpoint under {ckpt_root} after the save")
        saves.load(engine, found, dist, strategy)
        restored = trainable_fingerprint(engine)
        if restored != saved:
            raise RuntimeError(f"loaded trainable weights differ from the saved ones ({restored!r} != {saved!r})")
        verified = "restore verified" if moved else "weights did not move after the save: restore unverified"
        outcome = f"saved+loaded {size / 2**20:.1f} MiB {time.perf_counter() - began:.0f}s, {verified}"
        try:  # the first step of every resumed job: the loaded optimizer state must be usable
            resumed_loss = step()
        except Exception as exc:
            raise RuntimeError(f"the step after the resume failed: {type(exc).__name__}: {exc}") from exc
        if not math.isfinite(resumed_loss):
            raise RuntimeError(f"the step after the resume gave a loss of {resumed_loss}")
        outcome += ", a step after the resume ok"
    except Exception as exc:  # the peaks stand; the checkpoint column says what failed
        outcome = f"FAILED: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        engine.destroy()
        torch.distributed.destroy_process_group()
    return Measured(load_peak, step_peak, compute.precision, loss_fn.name, outcome, tokens_per_s, mfu)


def run_row(row: Row, body: Callable[[], Measured], limit: int | None = None) -> Row:
    from finetune_trainer.outcome import OUT_OF_MEMORY

    started = time.perf_counter()
    try:
        measured = body()
    except CaseFailed as failed:  # one failing configuration must not hide the others
        row.note = f"{'OOM' if failed.reason == str(OUT_OF_MEMORY) else 'failed'}: {failed.summary}"
        return row
    row.load, row.measured, row.checkpoint = measured.load_peak, measured.step_peak, measured.checkpoint
    row.tokens_per_s, row.mfu = measured.tokens_per_s, measured.mfu
    row.note = f"ok {time.perf_counter() - started:.0f}s, {measured.precision}, loss: {measured.loss}"
    if limit is not None and measured.step_peak is not None and measured.load_peak is not None:
        row.note += f", peak {max(measured.step_peak, measured.load_peak) / limit:.0%} of the card"
    return row


def save_random_model(config: dict[str, Any], folder: Path, on_gpu: bool) -> Path:
    """A random-init bf16 model saved like any local model (`load_model` reads a folder, and
    bitsandbytes quantises while it reads). Built directly on the GPU there: an 8B model
    initialised on the host takes minutes."""
    import torch
    from transformers import AutoModelForCausalLM

    from finetune_operator.plan.counting.meta_count import build_config

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(build_config(config), dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    if on_gpu:
        torch.cuda.empty_cache()
    return folder


class Sections:
    """The three sections over one work folder, one budget and the rows they print."""

    def __init__(self, work: Path, on_gpu: bool, budget: Budget, emit: Callable[[Row], None]) -> None:
        self.work, self.on_gpu, self.budget, self.emit = work, on_gpu, budget, emit
        self.steps = 4 if on_gpu else 2  # the first is not timed
        self.checkpoints = work / "checkpoints"
        self.build_estimate = 60.0 if on_gpu else 5.0
        """Seconds to create and save a model before it has been timed once."""

    def model(self, name: str, config: dict[str, Any], scale: float = 1.0) -> Path | None:
        folder = self.work / name
        if (folder / "config.json").exists():
            return folder
        if not self.budget.allows(f"creating the model {name}", self.build_estimate * scale):
            return None
        began = time.monotonic()
        isolated(partial(save_random_model, config, folder, self.on_gpu), self.on_gpu)
        self.build_estimate = (time.monotonic() - began) / scale
        return folder

    def a(self) -> None:
        from run_gpu_ground_truth import SHAPES

        shape, seq, micro = (GPU_SHAPE, 2048, 2) if self.on_gpu else ("tiny", 64, 2)
        config = llama_config(SHAPES[GPU_SHAPE] if self.on_gpu else TINY, GPU_VOCAB if self.on_gpu else 512)
        folder = self.model("a", config)
        longest = 0.0
        for case in CASES:
            label = case.label(shape, seq, micro)
            if folder is None:
                self.budget.skipped.append(f"a | {label}")
                continue
            if not self.budget.allows(f"a | {label}", longest):
                continue
            spec = job_spec(str(folder), case.method, case.stage, case.ckpt, seq, micro, 141, case.packed)
            plan, planned, planned_load = planned_bytes(spec)
            began = time.monotonic()
            row = Row("a", label, planned_load, None, planned)
            body = partial(train, folder, spec, plan, self.steps, self.on_gpu, self.checkpoints, packed=case.packed)
            self.emit(run_row(row, partial(isolated, body, self.on_gpu)))
            longest = max(longest, time.monotonic() - began)

    def b(self) -> None:
        from finetune_operator.api.strategy import Strategy
        from finetune_operator.plan.sources.model_source import catalogue_entry

        longest = 0.0
        for gib in CARDS_GIB:
            spec = job_spec(EIGHT_B, "lora", "auto", True, 2048, "auto", gib)
            plan, planned, planned_load = planned_bytes(spec)
            label = f"8B lora on {gib} GiB: {Strategy.from_plan(plan)}"
            if not self.on_gpu:
                label += " (tiny model on CPU)"
            if not self.budget.allows(f"b | {label}", longest):
                continue
            began = time.monotonic()
            row = Row("b", label, planned_load, None, planned)
            if not self.on_gpu:
                tiny = self.model("tiny-b", llama_config(TINY, 512))
                if tiny is None:
                    continue
                tiny_spec = job_spec(str(tiny), "lora", plan.zero_stage, plan.gradient_checkpointing, 64, 1, gib)
                tiny_plan, _, _ = planned_bytes(tiny_spec)
                body = partial(train, tiny, tiny_spec, tiny_plan, 2, False, self.checkpoints)
                self.emit(run_row(row, partial(isolated, body, False)))
                longest = max(longest, time.monotonic() - began)
                continue
            folder = self.model("8b", catalogue_entry("llama-3.1-8b").config, scale=6.0)
            if folder is None:
                self.budget.skipped.append(f"b | {label}")
                continue
            limit = gib * GIB
            model_spec = job_spec(str(folder), "lora", "auto", True, 2048, "auto", gib)
            body = partial(train, folder, model_spec, plan, 3, True, self.checkpoints, limit)
            self.emit(run_row(row, partial(isolated, body, True), limit))
            longest = max(longest, time.monotonic() - began)

    def c(self) -> None:
        import torch

        from finetune_trainer.outcome import failure_line

        if not self.on_gpu:
            try:  # no allocator limit on CPU: the error the CUDA allocator raises, raised by hand
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB (simulated in the dry run)"
                )
            except torch.OutOfMemoryError as exc:
                self.emit(Row("c", "forced OOM (simulated on CPU)", note=failure_line(exc, 0)))
            return
        label = f"full fine-tune of {GPU_SHAPE} on a 2 GiB card"
        folder = self.work / "a"
        if not (folder / "config.json").exists() or not self.budget.allows(f"c | {label}", 30.0):
            if not (folder / "config.json").exists():
                self.budget.skipped.append(f"c | {label}")
            return
        spec = job_spec(str(folder), "full", 0, False, 2048, 8, 141)
        plan, planned, _ = planned_bytes(spec)
        try:
            isolated(partial(train, folder, spec, plan, 1, True, self.checkpoints, 2 * GIB), True)
            line = "no error: the forced OOM did not happen"
        except CaseFailed as failed:
            line = failed.line
        self.emit(Row("c", label, planned=planned, note=line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run every case on a tiny model on the CPU, in bf16")
    parser.add_argument("--sections", default="abc", help="which sections to run, in order (default abc)")
    parser.add_argument("--smoke", action="store_true", help="the same as --dry-run (the benchmarks' common flag)")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=DEFAULT_BUDGET_SECONDS,
        help=f"seconds from the start within which cases start (default {DEFAULT_BUDGET_SECONDS}); "
        "cases that would not fit are skipped and named",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where models and checkpoints go (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if bad := set(args.sections) - set("abc"):
        parser.error(f"--sections: unknown {''.join(sorted(bad))!r}; allowed letters are a, b and c")
    args.dry_run = args.dry_run or args.smoke
    if args.dry_run:
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import deepspeed
    import torch

    on_gpu = torch.cuda.is_available() and not args.dry_run
    if not on_gpu:  # the cases' processes are forked from this one: import what they use once, here
        from finetune_trainer.pod.node_launcher import CPU_PRELOAD, import_preloaded

        for name in (*CPU_PRELOAD, *CASE_IMPORTS):
            import_preloaded(name)
    device = torch.cuda.get_device_name() if on_gpu else "CPU (dry run)"
    print(f"device: {device}, torch {torch.__version__}, deepspeed {deepspeed.__version__}", flush=True)
    print(" | ".join(COLUMNS), flush=True)
    budget = Budget(args.budget_seconds)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        sections = Sections(Path(tmp), on_gpu, budget, lambda row: print(row.line(), flush=True))
        runs = {"a": sections.a, "b": sections.b, "c": sections.c}
        for key in args.sections:
            runs[key]()
    for label in budget.skipped:
        print(f"skipped (budget of {args.budget_seconds:.0f}s): {label}", flush=True)
    summary = {"seconds": round(time.monotonic() - STARTED, 1), "gpu": on_gpu, "skipped": len(budget.skipped)}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
