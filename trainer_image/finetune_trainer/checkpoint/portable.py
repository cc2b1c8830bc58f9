"""The trainable state of a LoRA/QLoRA run, in a form every strategy can load.

DeepSpeed's own checkpoint is a picture of one strategy: ZeRO-3 reads `zero_pp_rank_*`
shards, stages 0–2 write `mp_rank_00_model_states.pt`, and the optimizer shards follow
the world size. After an out-of-memory re-plan (ZeRO-2 → ZeRO-3 → offload → smaller
micro-batch) or a change of `numNodes` that picture no longer fits the new engine.

For adapters the state worth keeping is small, so it is saved consolidated and keyed by
parameter name: each trainable parameter gathered in full (the fp32 master where ZeRO
keeps one), its Adam moments gathered from the ZeRO partitions, the optimizer's step
count, the dynamic loss scale of an fp16 run and the LR scheduler's state. The frozen base
weights are not saved: they come back from the model URI. Loading writes the values into
whatever partitions, offload buffers and micro-batching the new engine has.

Where each strategy keeps the fp32 master and the Adam moments of a parameter:
- ZeRO 1–3, with or without offload, and DeepSpeed's `BF16_Optimizer`: fp32 partitions that
  DeepSpeed's `safe_*_full_*` accessors gather and scatter by the model's parameter.
- ZeRO-0 in bf16 or fp16: `FP16_UnfusedOptimizer` (or `FP16_Optimizer` over a fused Adam)
  keeps an fp32 copy of each 16-bit parameter (flattened per group in the fused one), and the
  Adam state is keyed by that copy, not by the model's parameter (`_masters`).
- ZeRO-0 in fp32: the client optimizer steps the model's parameters themselves.
The Adam step count is saved as the optimizer counts it: DeepSpeed's ZeRO-0 16-bit wrappers
take one all-zero step when they are built, and their runs continue with that count on any
strategy, as they would have uninterrupted. It is restored where the optimizer's own first step
puts it (`step_value`): on the parameter's device for torch's fused AdamW, which the trainer uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRAINABLE_FILE = "trainable_state.pt"
MOMENTS = ("exp_avg", "exp_avg_sq")
LOSS_SCALE_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
"""A dynamic fp16 loss scale: DeepSpeed's ZeRO scaler (`DynamicLossScaler`) and its ZeRO-0 wrappers'
(`LossScaleConfig`) share the first three; hysteresis is the ZeRO scaler's alone."""


class PortableStateError(RuntimeError):
    """The engine's optimizer keeps its state where the portable format cannot reach it."""


def _trainable(engine: Any) -> list[tuple[str, Any]]:
    return [(name, p) for name, p in engine.module.named_parameters() if p.requires_grad]


def _basic_optimizer(engine: Any) -> Any:
    """The client optimizer (ZeRO wraps it; stage 0 without mixed precision hands it over)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def _is_zero3(param: Any) -> bool:
    return hasattr(param, "ds_id")


def _partitioned(param: Any) -> bool:
    """Whether DeepSpeed's `safe_*_full_*` accessors reach this parameter's master and moments
    (ZeRO 1-3 and `BF16_Optimizer` map each parameter onto their fp32 partitions; a rank that
    holds no fragment of it has the attribute too, set to None, and takes part with zeros)."""
    return _is_zero3(param) or hasattr(param, "_hp_mapping")


@dataclass(frozen=True)
class Master:
    """Where ZeRO-0 keeps a parameter's fp32 master: `numel` elements from `offset` of `key`, the
    tensor the client optimizer steps and keys its state by (the parameter itself in fp32)."""

    key: Any
    offset: int
    numel: int

    def of(self, tensor: Any) -> Any:
        """This parameter's slice of `key` or of a state tensor shaped like it (a view)."""
        return tensor.view(-1).narrow(0, self.offset, self.numel)


def _masters(engine: Any) -> dict[int, Master]:
    """ZeRO-0's fp32 masters by `id()` of the model's parameter, whatever the wrapper."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    wrapper = engine.optimizer
    masters: dict[int, Master] = {}
    if isinstance(wrapper, FP16_UnfusedOptimizer):  # one fp32 copy per 16-bit parameter
        for low, high in zip(wrapper.fp16_groups, wrapper.fp32_groups, strict=True):
            masters.update({id(p): Master(copy, 0, copy.numel()) for p, copy in zip(low, high, strict=True)})
    elif isinstance(wrapper, FP16_Optimizer):  # one flat fp32 copy per group, in the group's order
        for low, flat in zip(wrapper.fp16_groups, wrapper.fp32_groups_flat, strict=True):
            offset = 0
            for p in low:
                masters[id(p)] = Master(flat, offset, p.numel())
                offset += p.numel()
    else:  # the client optimizer over the model's own parameters
        for group in _basic_optimizer(engine).param_groups:
            masters.update({id(p): Master(p, 0, p.numel()) for p in group["params"]})
    return masters


def _master(masters: dict[int, Master], engine: Any, name: str, param: Any) -> Master:
    found = masters.get(id(param))
    if found is None:
        raise PortableStateError(
            f"{name}: no fp32 master reachable under this strategy ({type(engine.optimizer).__name__}); "
            "a strategy-independent checkpoint needs the trainable parameters' masters and Adam moments"
        )
    return found


def _full_value(engine: Any, name: str, param: Any, masters: dict[int, Master]) -> Any:
    """The full fp32 master of a trainable parameter (collective under ZeRO)."""
    from deepspeed.utils import safe_get_full_fp32_param

    if _partitioned(param):
        value = safe_get_full_fp32_param(param)
        if value is None:
            raise PortableStateError(f"{name}: partitioned parameter without an fp32 partition")
    else:
        master = _master(masters, engine, name, param)
        value = master.of(master.key).view(param.shape)
    return value.detach().float().cpu().clone()


def _full_moment(engine: Any, name: str, param: Any, key: str, masters: dict[int, Master]) -> Any:
    from deepspeed.utils import safe_get_full_optimizer_state

    value = None
    if _partitioned(param):
        value = safe_get_full_optimizer_state(param, key)
    else:
        master = _master(masters, engine, name, param)
        state = _basic_optimizer(engine).state.get(master.key)
        if state and key in state:
            value = master.of(state[key]).view(param.shape)
    if value is None:
        raise PortableStateError(
            f"{name}: no optimizer state '{key}' reachable under this strategy "
            f"({type(engine.optimizer).__name__}); a strategy-independent checkpoint needs Adam moments"
        )
    return value.detach().float().cpu().clone()


def _loss_scaler(engine: Any) -> Any:
    """The dynamic fp16 loss scaler of this engine's optimizer, or None (bf16, fp32, a static scale)."""
    wrapper = engine.optimizer
    scaler = getattr(wrapper, "loss_scaler", None)  # ZeRO 1-3
    if scaler is not None:
        return scaler if getattr(scaler, "dynamic", False) else None
    config = getattr(wrapper, "loss_scale_config", None)  # ZeRO-0's FP16_(Unfused)Optimizer
    return config if getattr(config, "dynamic_loss_scale", False) else None


def _loss_scale_state(engine: Any) -> dict[str, Any] | None:
    scaler = _loss_scaler(engine)
    if scaler is None:
        return None
    return {field: getattr(scaler, field) for field in LOSS_SCALE_FIELDS if hasattr(scaler, field)}


def _restore_loss_scale(engine: Any, saved: dict[str, Any] | None) -> None:
    """The saved dynamic loss scale, where both runs scale dynamically (a bf16 or fp32 run has none;
    an fp16 run resuming one of those starts at its initial scale)."""
    scaler = _loss_scaler(engine)
    if scaler is None or not saved:
        return
    for field, value in saved.items():
        if field in LOSS_SCALE_FIELDS and hasattr(scaler, field):
            setattr(scaler, field, value)


def _optimizer_step(engine: Any) -> int:
    """Optimizer updates taken so far (skipped fp16 overflow steps do not count)."""
    for state in _basic_optimizer(engine).state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def gather(engine: Any, keep: bool = True) -> dict[str, Any]:
    """Collective: every rank calls it; only ranks with `keep` hold the gathered tensors."""
    params: dict[str, Any] = {}
    moments: dict[str, dict[str, Any]] = {key: {} for key in MOMENTS}
    masters = _masters(engine)
    for name, param in _trainable(engine):
        value = _full_value(engine, name, param, masters)
        if keep:
            params[name] = value
        for key in MOMENTS:
            value = _full_moment(engine, name, param, key, masters)
            if keep:
                moments[key][name] = value
    scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
    return {
        "params": params,
        "moments": moments,
        "optimizer_step": _optimizer_step(engine),
        "loss_scale": _loss_scale_state(engine),
        "scheduler": scheduler,
    }


def save(engine: Any, folder: Path, rank: int) -> None:
    """Collective gather; rank 0 writes the file into the (temporary) checkpoint folder."""
    import torch

    state = gather(engine, keep=rank == 0)  # the others take part in the collectives only
    if rank == 0:
        torch.save(state, folder / TRAINABLE_FILE)


def size_bytes(state: dict[str, Any]) -> int:
    """Bytes of tensor data in a gathered state (what the file costs, less pickling)."""
    tensors = [*state["params"].values(), *(t for m in state["moments"].values() for t in m.values())]
    return sum(t.numel() * t.element_size() for t in tensors)


def step_value(optimizer: Any, group: dict[str, Any], param: Any, step: int) -> Any:
    """Adam's step count as `optimizer`'s own first step would create it for `param`.

    torch's fused and capturable Adam(W) keep it as a float32 tensor on the parameter's device
    (their kernels read it there: a CPU tensor beside CUDA parameters fails the first step after
    a resume), the others as a CPU scalar tensor of torch's scalar dtype; DeepSpeed's CPU Adam
    takes a plain int (its C++ kernel's argument)."""
    import torch

    if type(optimizer).__name__ == "DeepSpeedCPUAdam":
        return step
    if group.get("fused") or group.get("capturable"):
        return torch.tensor(float(step), dtype=torch.float32, device=param.device)
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.tensor(float(step), dtype=scalar)


def _ensure_optimizer_state(engine: Any, step: int) -> None:
    """Create the Adam state a fresh engine has not built yet (it is lazy until the first step)."""
    import torch

    basic = _basic_optimizer(engine)
    # ZeRO-3 hands its fp32 partitions to the optimizer's param groups only during a step
    flat = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    held = list(flat) if flat is not None else [p for group in basic.param_groups for p in group["params"]]
    groups = {id(p): group for group in basic.param_groups for p in group["params"]}
    for p in held:
        if p is not None:
            state = basic.state[p]
            for key in MOMENTS:
                if key not in state:
                    state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] = step_value(basic, groups.get(id(p), basic.defaults), p, step)
    relink = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if relink is not None:  # ZeRO 1/2: map each parameter's fragment onto the new state tensors
        engine.optimizer._hp_optimizer_states_linked = False
        relink()


def _set_module_weight(param: Any, value: Any) -> None:
    """The weight the forward pass reads (the low-precision copy beside ZeRO's fp32 master)."""
    import torch

    if _is_zero3(param):
        import deepspeed

        with deepspeed.zero.GatheredParameters([param], modifier_rank=0), torch.no_grad():
            param.data.copy_(value.to(param.dtype))
    else:
        with torch.no_grad():
            param.data.copy_(value.to(param.device, param.dtype))


Lookup = Callable[[str], tuple[Any, dict[str, Any]]]
"""A parameter's name -> (its full fp32 value, its Adam moments by key), on the CPU."""


def restore(
    engine: Any,
    names: list[str],
    lookup: Lookup,
    optimizer_step: int,
    scheduler: Any,
    *,
    loss_scale: dict[str, Any] | None = None,
) -> None:
    """Collective: write full values and moments, one parameter at a time, into this engine's
    partitions and offload buffers, whatever its strategy; then the step count, the dynamic loss
    scale and the LR schedule. `names` are the trainable parameters the saved state holds
    (checked against the engine's)."""
    import torch
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    trainable = _trainable(engine)
    mine = [name for name, _ in trainable]
    missing = sorted(set(mine) - set(names))
    extra = sorted(set(names) - set(mine))
    if missing or extra:
        raise PortableStateError(
            f"trainable parameters differ from this model's (missing {missing[:3]}, unexpected {extra[:3]}); "
            "was the LoRA rank, targets or model changed?"
        )
    _ensure_optimizer_state(engine, optimizer_step)
    basic = _basic_optimizer(engine)
    masters = _masters(engine)
    for name, param in trainable:
        value, moments = lookup(name)
        value = value.reshape(_full_shape(param))
        _set_module_weight(param, value)
        if _partitioned(param):
            safe_set_full_fp32_param(param, value.to(param.device))
            for key in MOMENTS:
                safe_set_full_optimizer_state(param, moments[key].reshape(value.shape).to(param.device), key)
            continue
        master = _master(masters, engine, name, param)
        with torch.no_grad():
            master.of(master.key).copy_(value.flatten())
            for key in MOMENTS:
                master.of(basic.state[master.key][key]).copy_(moments[key].flatten())
    _restore_loss_scale(engine, loss_scale)
    if engine.lr_scheduler is not None and scheduler is not None:
        engine.lr_scheduler.load_state_dict(scheduler)
        for group, lr in zip(basic.param_groups, engine.lr_scheduler.get_last_lr(), strict=True):
            group["lr"] = lr


def _full_shape(param: Any) -> Any:
    return param.ds_shape if _is_zero3(param) else param.shape


def load(engine: Any, folder: Path) -> dict[str, Any]:
    """Collective: write the saved trainable state into this engine, whatever its strategy."""
    import torch

    state: dict[str, Any] = torch.load(folder / TRAINABLE_FILE, map_location="cpu", weights_only=True)

    def lookup(name: str) -> tuple[Any, dict[str, Any]]:
        return state["params"][name], {key: state["moments"][key][name] for key in MOMENTS}

    try:
        restore(
            engine,
            list(state["params"]),
            lookup,
            int(state["optimizer_step"]),
            state["scheduler"],
            loss_scale=state.get("loss_scale"),  # absent from files written before fp16 runs saved it
        )
    except PortableStateError as exc:
        raise PortableStateError(f"{folder}: {exc}") from exc
    return state
