"""Starting from an adapter (`model.adapter`): a finished job's LoRA adapter trains on.

The folder is where `paths.resolve_uri` puts the URI (a mounted claim, the pod's mirror of an
`s3://` prefix, a path). It must be a peft LoRA adapter of the job's model with method.lora's
rank, alpha and targets: the planner counted those, so an adapter of another shape is refused
before it loads, naming the field. It is loaded as the trainable adapter ("default", the name
`get_peft_model` gives, so checkpoints and exports read the same either way). A preference
objective also loads it a second time, frozen, as its reference (`REFERENCE`): DPO after SFT
compares the policy against the SFT model, as TRL's `ref_adapter_name` does, and the adapter it
exports applies to the same base as the one it started from.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.errors import TrainerError
from finetune_trainer.settings import ConfigError
from finetune_trainer.storage import paths

log = logging.getLogger(__name__)

TRAINED = "default"
"""The adapter that trains (peft's default name, as `get_peft_model` names it)."""
REFERENCE = "reference"
"""The start adapter's frozen copy, a preference objective's reference."""
CONFIG = "adapter_config.json"


class AdapterNotFound(TrainerError, RuntimeError):
    """`model.adapter` points at no LoRA adapter; the message says where it looked."""

    reason = TerminationReason.MODEL_NOT_FOUND


def adapter_folder(spec: FineTuneJobSpec) -> Path:
    """The local folder of `model.adapter`, checked to hold a peft adapter config."""
    uri = spec.model.adapter
    if uri is None:
        raise ValueError("the job does not start from an adapter")
    folder = Path(str(paths.resolve_uri(uri)))
    if not (folder / CONFIG).is_file():
        found = sorted(p.name for p in folder.iterdir())[:8] if folder.is_dir() else None
        what = "no such folder" if found is None else f"it holds {', '.join(found) or 'nothing'}"
        raise AdapterNotFound(
            f"model.adapter {uri!r}: no LoRA adapter at {folder} ({CONFIG} is missing; {what}); "
            "give the folder of a finished job's status.result.adapterUri"
        )
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterNotFound(f"model.adapter: {folder / CONFIG} is unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterNotFound(f"model.adapter: {folder / CONFIG} is not a JSON object")
    return config


def mismatches(spec: FineTuneJobSpec, config: dict[str, Any]) -> list[str]:
    """How the adapter's config differs from what the job planned (method.lora), one line each."""
    lora = spec.method.lora_or_default
    problems = []
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        problems.append(f"model.adapter is a {config.get('peft_type')} adapter: only LoRA adapters are trained on")
    if config.get("r") != lora.r:
        problems.append(f"method.lora.r is {lora.r} but the adapter's rank is {config.get('r')}: set it to match")
    if config.get("lora_alpha") != lora.alpha:
        problems.append(
            f"method.lora.alpha is {lora.alpha} but the adapter's is {config.get('lora_alpha')}: set it to match"
        )
    wanted = list(lora.target_modules)
    targets = config.get("target_modules")
    have = sorted(targets) if isinstance(targets, list) else [str(targets)]
    if wanted != ["all-linear"] and sorted(wanted) != have:
        problems.append(
            f"method.lora.targetModules is {sorted(wanted)} but the adapter adapts {have}: set them to match "
            "(or all-linear, which takes the adapter's)"
        )
    return problems


def attach(model: Any, spec: FineTuneJobSpec, with_reference: bool) -> Any:
    """The base `model` with `model.adapter` loaded trainable (and, `with_reference`, again frozen
    as the reference); the caller casts dtypes and builds the engine as for a new adapter."""
    from peft import PeftModel

    folder = adapter_folder(spec)
    problems = mismatches(spec, read_config(folder))
    if problems:
        raise ConfigError("; ".join(problems))
    model = PeftModel.from_pretrained(model, str(folder), adapter_name=TRAINED, is_trainable=True)
    if with_reference:
        model.load_adapter(str(folder), adapter_name=REFERENCE, is_trainable=False)
        model.set_adapter(TRAINED)  # trainable again, the reference frozen
    log.warning("started from the adapter %s (%s)%s", spec.model.adapter, folder,
                ", kept frozen as the reference" if with_reference else "")  # fmt: skip
    return model


def match_reference_dtype(model: Any) -> None:
    """Give each reference weight its trained twin's dtype (ZeRO-3 and the forward expect one
    dtype per layer, and `uniform_trainable_dtype` casts only trainable weights)."""
    params = dict(model.named_parameters())
    for name, param in params.items():
        if f".{REFERENCE}." not in name:
            continue
        twin = params.get(name.replace(f".{REFERENCE}.", f".{TRAINED}."))
        if twin is not None and twin.dtype != param.dtype and not hasattr(param, "ds_id"):
            param.data = param.data.to(twin.dtype)


@contextlib.contextmanager
def reference_active(module: Any) -> Iterator[None]:
    """Inside, the model computes with the frozen start adapter instead of the trained one (for
    the reference forward, under no_grad); after, the trained adapter is active and trainable."""
    module.set_adapter(REFERENCE)
    try:
        yield
    finally:
        module.set_adapter(TRAINED)
