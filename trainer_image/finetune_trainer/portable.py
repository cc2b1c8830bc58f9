"""The trainable state of a LoRA/QLoRA run, in a form every strategy can load.

DeepSpeed's own checkpoint is a picture of one strategy: ZeRO-3 reads `zero_pp_rank_*`
shards, stages 0–2 write `mp_rank_00_model_states.pt`, and the optimizer shards follow
the world size. After an out-of-memory re-plan (ZeRO-2 → ZeRO-3 → offload → smaller
micro-batch) or a change of `numNodes` that picture no longer fits the new engine.

For adapters the state worth keeping is small, so it is saved consolidated and keyed by
parameter name: each trainable parameter gathered in full (the fp32 master where ZeRO
keeps one), its Adam moments gathered from the ZeRO partitions, the optimizer's step
count and the LR scheduler's state. The frozen base weights are not saved: they come
back from the model URI. Loading writes the values into whatever partitions, offload
buffers and micro-batching the new engine has, through DeepSpeed's `safe_*_full_*`
accessors, which work at ZeRO 1–3 with or without offload (stage 0 holds plain tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

TRAINABLE_FILE = "trainable_state.pt"
MOMENTS = ("exp_avg", "exp_avg_sq")


class PortableStateError(RuntimeError):
    """The engine's optimizer keeps its state where the portable format cannot reach it."""


def _trainable(engine: Any) -> list[tuple[str, Any]]:
    return [(name, p) for name, p in engine.module.named_parameters() if p.requires_grad]


def _basic_optimizer(engine: Any) -> Any:
    """The client optimizer (ZeRO wraps it; stage 0 without mixed precision hands it over)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def _is_zero3(param: Any) -> bool:
    return hasattr(param, "ds_id")


def _full_value(engine: Any, name: str, param: Any) -> Any:
    """The full fp32 value of a trainable parameter (collective under ZeRO)."""
    from deepspeed.utils import safe_get_full_fp32_param

    value = safe_get_full_fp32_param(param)
    if value is None:
        if _is_zero3(param):
            raise PortableStateError(f"{name}: ZeRO-3 parameter without an fp32 partition")
        value = param.detach()
    return value.detach().float().cpu().clone()


def _full_moment(engine: Any, name: str, param: Any, key: str) -> Any:
    from deepspeed.utils import safe_get_full_optimizer_state

    value = safe_get_full_optimizer_state(param, key)
    if value is None:
        state = _basic_optimizer(engine).state.get(param)
        if not state or key not in state:
            raise PortableStateError(
                f"{name}: no optimizer state '{key}' reachable under this strategy "
                f"({type(engine.optimizer).__name__}); a strategy-independent checkpoint needs Adam moments"
            )
        value = state[key]
    return value.detach().float().cpu().clone()


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
    for name, param in _trainable(engine):
        value = _full_value(engine, name, param)
        if keep:
            params[name] = value
        for key in MOMENTS:
            value = _full_moment(engine, name, param, key)
            if keep:
                moments[key][name] = value
    scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
    return {
        "params": params,
        "moments": moments,
        "optimizer_step": _optimizer_step(engine),
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


def _ensure_optimizer_state(engine: Any, step: int) -> None:
    """Create the Adam state a fresh engine has not built yet (it is lazy until the first step)."""
    import torch

    basic = _basic_optimizer(engine)
    integer_step = type(basic).__name__ == "DeepSpeedCPUAdam"  # its C++ kernel takes the step as an int
    # ZeRO-3 hands its fp32 partitions to the optimizer's param groups only during a step
    flat = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    held = list(flat) if flat is not None else [p for group in basic.param_groups for p in group["params"]]
    for p in held:
        if p is not None:
            state = basic.state[p]
            for key in MOMENTS:
                if key not in state:
                    state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] = step if integer_step else torch.tensor(float(step), dtype=torch.float32)
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


def restore(engine: Any, names: list[str], lookup: Lookup, optimizer_step: int, scheduler: Any) -> None:
    """Collective: write full values and moments, one parameter at a time, into this engine's
    partitions and offload buffers, whatever its strategy; then the step count and LR schedule.
    `names` are the trainable parameters the saved state holds (checked against the engine's)."""
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
    for name, param in trainable:
        value, moments = lookup(name)
        value = value.reshape(_full_shape(param))
        _set_module_weight(param, value)
        safe_set_full_fp32_param(param, value.to(param.device))
        for key in MOMENTS:
            moment = moments[key].reshape(value.shape)
            if hasattr(param, "_hp_mapping") or _is_zero3(param):
                safe_set_full_optimizer_state(param, moment.to(param.device), key)
            else:
                basic.state[param][key].copy_(moment.to(param.device))
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
        restore(engine, list(state["params"]), lookup, int(state["optimizer_step"]), state["scheduler"])
    except PortableStateError as exc:
        raise PortableStateError(f"{folder}: {exc}") from exc
    return state
