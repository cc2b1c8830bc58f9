"""The portable trainable state of fp16 runs: DeepSpeed's real fp16 optimizer wrappers, on CPU tensors.

DeepSpeed's CPU accelerator refuses fp16 on a CPU without oneDNN fp16 kernels ("Type fp16 is not
supported on your device"), so the trainer tier (real ranks) runs bf16 and never builds an fp16
wrapper. Here one process (a gloo group of one rank) builds them over tiny CPU models:

- `FP16_UnfusedOptimizer` (ZeRO-0 with the client AdamW: what a GPU run of ZeRO-0 uses) and
  `FP16_Optimizer` (ZeRO-0 over a fused Adam, flat fp32 masters), constructed directly as the
  engine constructs them: no engine, nothing patched. Their Adam state is keyed by fp32 copies
  the model never sees, which the portable format reached through the model's parameters
  before (`PortableStateError: ... no optimizer state 'exp_avg'`).
- Real DeepSpeed engines at ZeRO 0-3 in fp16. Here the accelerator's answer to "does this CPU
  run fp16" is patched to yes: DeepSpeed's ZeRO 1-3 optimizers cannot step without their engine
  (its backward drives their gradient hooks), and the engine's sanity check asks that question
  and nothing else. torch itself runs fp16 on any CPU.

Both runs take steps whose gradients overflow, so the dynamic loss scale has moved (halved; at
ZeRO 1-3 hysteresis first absorbs one overflow) and must be saved and restored with the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_localcluster.ports import free_port
from finetune_trainer.checkpoint import portable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LR = 0.01
OVERFLOW_STEPS = (1, 2)
"""Steps whose loss is multiplied by inf: their gradients overflow, the step is skipped."""


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A gloo process group of this process alone (DeepSpeed's wrappers ask for ranks and reduce)."""

    import deepspeed.comm as dist

    from finetune_trainer.deepspeed_import import import_deepspeed

    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    deepspeed = import_deepspeed()  # without its CPU shm op, as the trainer's ranks
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    try:
        yield
    finally:
        dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _model(fresh: bool = False) -> Any:
    """Three Linear layers, the first frozen (as a LoRA model's base), in fp16. `fresh`: the
    trainable layers start elsewhere (a resumed run's come from the checkpoint; its base does not)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
    )
    model[0].requires_grad_(False)
    if fresh:
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.normal_()
    return model.half()


def _batch(step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(4, 8, generator=generator).half(), torch.randn(4, 4, generator=generator)


def _loss(model: Any, step: int, overflow: bool = False) -> Any:
    inputs, target = _batch(step)
    loss = ((model(inputs).float() - target) ** 2).mean()
    return loss * float("inf") if overflow else loss


def _scheduler(optimizer: Any) -> Any:
    import torch

    from finetune_trainer.rank.schedule import lr_lambda

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", 2, 20))


# ---- the ZeRO-0 wrappers, constructed directly ---------------------------------------------------

DYNAMIC_LOSS_ARGS = {"init_scale": 2**16, "scale_window": 1000, "delayed_shift": 2, "consecutive_hysteresis": False,
                     "min_scale": 1}  # fmt: skip
"""What the engine passes for the rendered `fp16: {loss_scale: 0, initial_scale_power: 16}`."""


def _wrapped(kind: str, model: Any) -> SimpleNamespace:
    """`model` with AdamW under DeepSpeed's ZeRO-0 fp16 wrapper `kind`, as the engine builds it."""
    import torch
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    client = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    scheduler = _scheduler(client)
    fused = kind == "FP16_Optimizer"
    config = LossScaleConfig(
        low_precision_dtype=torch.float16,
        dynamic_loss_scale=True,
        static_loss_scale=0,
        dynamic_loss_args=DYNAMIC_LOSS_ARGS,
        profile=LossScaleProfile.FUSED if fused else LossScaleProfile.UNFUSED,
    )
    wrapper_class = FP16_Optimizer if fused else FP16_UnfusedOptimizer
    wrapper = wrapper_class(client, loss_scale_config=config, low_precision_dtype=torch.float16, clip_grad=1.0)
    return SimpleNamespace(module=model, optimizer=wrapper, lr_scheduler=scheduler)


def _wrapper_step(engine: SimpleNamespace, step: int) -> float:
    loss = _loss(engine.module, step, overflow=step in OVERFLOW_STEPS)
    engine.optimizer.backward(loss)
    overflow = engine.optimizer.step()
    engine.optimizer.zero_grad()
    if not overflow:
        engine.lr_scheduler.step()
    return float(loss.detach())


def _masters_and_moments(engine: Any) -> dict[str, Any]:
    """Every trainable parameter's fp32 master and Adam moments, read the way `portable` saves them."""
    state = portable.gather(engine)
    return {"params": state["params"], **{key: state["moments"][key] for key in portable.MOMENTS}}


def _loss_scale(engine: Any) -> dict[str, Any]:
    scaler = engine.optimizer.loss_scale_config if hasattr(engine.optimizer, "loss_scale_config") else None
    scaler = scaler or engine.optimizer.loss_scaler
    return {field: getattr(scaler, field) for field in portable.LOSS_SCALE_FIELDS if hasattr(scaler, field)}


def _assert_same(got: dict[str, Any], want: dict[str, Any], exact: bool) -> None:
    import torch

    for part, tensors in want.items():
        assert got[part].keys() == tensors.keys(), part
        for name, tensor in tensors.items():
            if exact:
                assert torch.equal(got[part][name], tensor), (part, name)
            else:
                assert torch.allclose(got[part][name], tensor, rtol=1e-6, atol=1e-8), (part, name)


WRAPPERS = ["FP16_UnfusedOptimizer", "FP16_Optimizer"]


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("target", WRAPPERS)
@pytest.mark.parametrize("source", WRAPPERS)
def test_a_zero0_fp16_wrapper_saves_masters_moments_and_loss_scale_and_another_one_continues(
    tmp_path: Path, source: str, target: str
) -> None:
    import torch

    saved = _wrapped(source, _model())
    for step in range(4):
        _wrapper_step(saved, step)
    scale = _loss_scale(saved)
    assert scale["cur_scale"] == 2**16 / 2 ** len(OVERFLOW_STEPS) and scale["last_overflow_iter"] == 2, scale
    portable.save(saved, tmp_path, rank=0)
    written = torch.load(tmp_path / portable.TRAINABLE_FILE, weights_only=True)
    frozen = {f"{n}" for n, p in saved.module.named_parameters() if not p.requires_grad}
    assert set(written["params"]).isdisjoint(frozen) and len(written["params"]) == 4
    assert all(t.dtype == torch.float32 for t in written["params"].values())  # the masters, not the fp16 copies
    assert written["loss_scale"] == scale

    fresh = _wrapped(target, _model(fresh=True))  # everything trained must come from the file
    portable.load(fresh, tmp_path)
    _assert_same(_masters_and_moments(fresh), _masters_and_moments(saved), exact=True)
    assert _loss_scale(fresh) == {k: v for k, v in scale.items() if k in _loss_scale(fresh)}
    assert portable._optimizer_step(fresh) == portable._optimizer_step(saved)
    assert fresh.lr_scheduler.get_last_lr() == saved.lr_scheduler.get_last_lr()
    for old, new in zip(saved.module.parameters(), fresh.module.parameters(), strict=True):
        if old.requires_grad:  # the fp16 weights the forward pass reads are the masters' casts
            assert torch.equal(old, new)

    for step in (4, 5):  # the runs continue alike: the same loss, the same updates
        assert _wrapper_step(fresh, step) == _wrapper_step(saved, step)
    _assert_same(_masters_and_moments(fresh), _masters_and_moments(saved), exact=source == target)


# ---- real engines at ZeRO 0-3 ----------------------------------------------------------------------


@pytest.fixture
def fp16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's CPU accelerator answers yes to fp16 (see the module docstring: the only way to
    build DeepSpeed's ZeRO 1-3 fp16 optimizers on a CPU without oneDNN fp16 kernels)."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


def _engine(zero: int, offload: bool = False, fresh: bool = False) -> Any:
    import deepspeed
    import torch

    model = _model(fresh).float()
    client = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    zero_config: dict[str, Any] = {"stage": zero}
    if offload:
        zero_config["offload_optimizer"] = {"device": "cpu"}
    config = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": zero_config,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1_000_000,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=client, lr_scheduler=_scheduler(client), config=config
    )
    return engine


def _engine_step(engine: Any, step: int) -> float:
    loss = _loss(engine, step, overflow=step in OVERFLOW_STEPS)
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


STRATEGIES: dict[str, tuple[int, bool]] = {
    "zero0": (0, False),
    "zero1": (1, False),
    "zero2-offload": (2, True),
    "zero3": (3, False),
}
WRAPPER_OF_STAGE = {0: "FP16_UnfusedOptimizer", 1: "DeepSpeedZeroOptimizer", 2: "DeepSpeedZeroOptimizer",
                    3: "DeepSpeedZeroOptimizer_Stage3"}  # fmt: skip


@dataclass
class Saved:
    """A run's portable state after its overflowed steps, and what the run computed next."""

    folder: Path
    scale: dict[str, Any]
    state: dict[str, Any]
    next_losses: list[float]


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Saved]:
    """The saved state of a four-step fp16 run under a strategy (built once per strategy)."""
    cache: dict[str, Saved] = {}

    def build(strategy: str) -> Saved:
        if strategy not in cache:
            folder = tmp_path_factory.mktemp(f"{strategy}-fp16")
            engine = _engine(*STRATEGIES[strategy])
            for step in range(4):
                _engine_step(engine, step)
            portable.save(engine, folder, rank=0)
            saved = Saved(folder, _loss_scale(engine), _masters_and_moments(engine), [])
            saved.next_losses = [_engine_step(engine, step) for step in (4, 5)]
            cache[strategy] = saved
        return cache[strategy]

    return build


SAME_UPDATE_RULE = {("zero0", "zero0"), *((a, b) for a in STRATEGIES for b in STRATEGIES if "zero0" not in (a, b))}
"""Source/target pairs whose next update follows the same rule. DeepSpeed's engine (0.19) scales
the loss for its ZeRO 1-3 optimizers only: at ZeRO-0 fp16 `FP16_UnfusedOptimizer.step` divides
unscaled gradients by the loss scale (deepspeedai/DeepSpeed#8393), so a ZeRO-0 fp16 run and a
ZeRO 1-3 one take different steps from the same state; the state itself still moves intact."""


@pytest.mark.usefixtures("one_rank", "fp16_cpu")
@pytest.mark.parametrize("target", list(STRATEGIES))
@pytest.mark.parametrize("source", ["zero0", "zero2-offload"])
def test_an_fp16_run_resumes_under_every_zero_stage_with_its_loss_scale(
    source: str, target: str, saved_runs: Callable[[str], Saved]
) -> None:
    """Masters, moments and the dynamic loss scale (`LossScaleConfig` at ZeRO-0, `DynamicLossScaler`
    with its hysteresis at ZeRO 1-3) move between the fp16 wrappers of real engines intact: the
    resumed engine computes the loss the saved run computed next, and where both follow the same
    update rule, the loss after that too."""
    saved = saved_runs(source)
    assert saved.scale["cur_scale"] < 2**16 and saved.scale["last_overflow_iter"] == 2, saved.scale
    zero, offload = STRATEGIES[target]
    engine = _engine(zero, offload, fresh=True)
    assert type(engine.optimizer).__name__ == WRAPPER_OF_STAGE[zero]
    portable.load(engine, saved.folder)
    _assert_same(_masters_and_moments(engine), saved.state, exact=True)
    restored = _loss_scale(engine)
    assert restored == {k: saved.scale.get(k, restored[k]) for k in restored}  # hysteresis: ZeRO 1-3 only
    first, second = (_engine_step(engine, step) for step in (4, 5))
    assert first == saved.next_losses[0]  # the same fp16 weights: the same forward
    if (source, target) in SAME_UPDATE_RULE:
        assert second == pytest.approx(saved.next_losses[1], rel=1e-4)  # fp16 gradients reduced in another order


@pytest.mark.usefixtures("one_rank", "fp16_cpu")
def test_spent_hysteresis_survives_a_resume_between_zero_stages(tmp_path: Path) -> None:
    """At ZeRO 1-3 the first overflow only spends hysteresis; a resume keeps it spent, so the next
    overflow halves the scale at once, as it would have without the resume."""
    engine = _engine(2)
    for step in range(2):  # one overflow (step 1): hysteresis 2 -> 1, the scale is unchanged
        _engine_step(engine, step)
    before = _loss_scale(engine)
    assert (before["cur_scale"], before["cur_hysteresis"]) == (2**16, 1), before
    portable.save(engine, tmp_path, rank=0)
    resumed = _engine(3, fresh=True)
    portable.load(resumed, tmp_path)
    assert _loss_scale(resumed) == before
    _engine_step(resumed, 2)  # overflows
    assert _loss_scale(resumed)["cur_scale"] == 2**15
