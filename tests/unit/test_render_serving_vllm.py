"""`vllm serve`'s arguments and the LoRA ranks vLLM refuses (render/serving/vllm.py). The arguments
are run by a real vLLM in tests/trainer/test_serving_vllm.py; these pin their shape and the refusals."""

from __future__ import annotations

import pytest

from finetune_operator.api.serving import VLLM_MAX_LORA_RANKS
from finetune_operator.render.serving.choice import Refused
from finetune_operator.render.serving.vllm import (
    SUPPORTED_LORA_RANKS,
    lora_args,
    lora_rank_refusal,
    server_args,
    smallest_max_lora_rank,
)


def test_the_model_comes_first_and_lora_stays_off_without_adapters() -> None:
    assert server_args("/models/base", served_name="chat", adapters={}, max_lora_rank=16) == [
        "/models/base",
        "--served-model-name=chat",
    ]


def test_adapters_are_lora_modules_under_one_flag_with_the_rank_and_slots() -> None:
    args = server_args(
        "/mnt/models/base",
        served_name="chat-base",
        adapters={"chat": "/mnt/models/adapters/chat", "alt": "/mnt/alt"},
        max_lora_rank=32,
        dtype="float32",
        max_model_len=512,
        extra=["--seed=1"],
    )
    assert args == [
        "/mnt/models/base",
        "--served-model-name=chat-base",
        "--enable-lora",
        "--max-lora-rank=32",
        "--max-loras=2",
        "--lora-modules",
        "alt=/mnt/alt",
        "chat=/mnt/models/adapters/chat",
        "--dtype=float32",
        "--max-model-len=512",
        "--seed=1",
    ]


def test_the_lora_arguments_alone_are_the_ones_server_args_passes() -> None:
    adapters = {"chat": "/mnt/models/adapters/chat"}
    assert lora_args({}, 16) == []
    assert lora_args(adapters, 16) == server_args("m", served_name="m", adapters=adapters, max_lora_rank=16)[2:]


@pytest.mark.parametrize(
    ("adapters", "rank", "message"),
    [
        ({"chat": "/a"}, 24, "max_lora_rank 24 is not one of vLLM's"),
        ({"a=b": "/a"}, 16, "LoRA module name 'a=b'"),
        ({"chat": "/a,b"}, 16, "vLLM reads a value with ',' as JSON"),
        ({"chat": ""}, 16, "LoRA module path ''"),
    ],
)
def test_arguments_vllm_would_misread_are_refused(adapters: dict[str, str], rank: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        server_args("m", served_name="m", adapters=adapters, max_lora_rank=rank)


def test_the_ranks_are_vllms_one_list() -> None:
    # vllm/config/lora.py of vLLM 0.32: MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
    assert SUPPORTED_LORA_RANKS == VLLM_MAX_LORA_RANKS == (1, 8, 16, 32, 64, 128, 256, 320, 512)


@pytest.mark.parametrize(("rank", "fits"), [(1, 1), (2, 8), (8, 8), (9, 16), (300, 320), (512, 512), (513, None)])
def test_the_smallest_max_lora_rank_that_serves_a_rank(rank: int, fits: int | None) -> None:
    assert smallest_max_lora_rank(rank) == fits


@pytest.mark.parametrize(("rank", "max_rank"), [(8, 8), (1, 16), (16, 16), (512, 512)])
def test_an_adapter_within_max_lora_rank_is_served(rank: int, max_rank: int) -> None:
    assert lora_rank_refusal(rank, max_rank) is None


@pytest.mark.parametrize(
    ("rank", "max_rank", "field", "says"),
    [
        (32, 16, "spec.serving.maxLoraRank", "the adapter's rank 32 (spec.method.lora.r) is above 16"),
        (32, 16, "spec.serving.maxLoraRank", "set 32 or more"),
        (17, 16, "spec.serving.maxLoraRank", "set 32 or more, or serve the merged model"),
        (600, 512, "spec.method.lora.r", "rank 600 is above 512, the largest LoRA rank vLLM serves"),
        (8, 24, "spec.serving.maxLoraRank", "24 is not one of vLLM's --max-lora-rank values"),
    ],
)
def test_a_rank_vllm_refuses_names_the_field_to_change(rank: int, max_rank: int, field: str, says: str) -> None:
    refused = lora_rank_refusal(rank, max_rank)
    assert isinstance(refused, Refused)
    assert refused.field == field
    assert says in refused.message


def test_the_fields_named_are_the_callers() -> None:
    refused = lora_rank_refusal(64, 16, rank_field="spec.method.lora.r", max_field="serving.maxLoraRank")
    assert refused is not None and refused.field == "serving.maxLoraRank"
