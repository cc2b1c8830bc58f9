"""Fine-tuning a real pretrained model: SmolLM2-135M-Instruct (`builtin://smollm2-135m-instruct`).

The tiny random Llama proves the machinery; these prove the fine-tuning: the real chat
template's masking, token by token; EOS closing every response; LoRA leaving every base
weight bit-identical; the merged model answering the learned task it could not answer
before while still answering general questions; QLoRA on the 4-bit quantised model.
The model is converted once per machine (the tier's `smollm2_dir` fixture) and linked into each
run's cache, as the trainer finds it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from tests.support.training_runs import Run, job_manifest, link_model_cache, render_config, write_jsonl

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

MODEL_URI = "builtin://smollm2-135m-instruct"
REGRESSION = [
    ("What is the capital of France?", "paris"),
    ("What is the capital of Japan?", "tokyo"),
]
"""General prompts the base model answers; the fine-tuned one must still (substring, lower-case).

Known damage, not asserted: after this training the merged model answers "What colour is the
sky on a clear day?" in the code ("river tiger"), since colours are the code's inputs; the base
answers "blue". Mixing general chat into the training data is the fix, not a different prompt."""


def _generate(model: Any, tokenizer: Any, turns: list[dict[str, str]], max_new_tokens: int = 24) -> str:
    import torch

    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)).strip()


def _code_prompts(words: list[str], seed: int, count: int) -> list[tuple[str, str]]:
    from finetune_trainer.data.builtin_datasets import secret_code

    table, rng = secret_code(), random.Random(seed)
    pairs = []
    for _ in range(count):
        chosen = rng.choices(words, k=rng.randint(1, 2))
        pairs.append((" ".join(chosen), " ".join(table[w] for w in chosen)))
    return pairs


def _code_turns(text: str) -> list[dict[str, str]]:
    from finetune_trainer.data.builtin_datasets import SECRET_CODE_SYSTEM

    return [{"role": "system", "content": SECRET_CODE_SYSTEM}, {"role": "user", "content": text}]


@pytest.mark.timeout(600)
def test_chat_template_trains_exactly_the_assistant_tokens_and_each_ends_with_eos(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    from finetune_trainer.data.formats import IGNORE_INDEX, tokenize_record

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    turns = [
        {"role": "system", "content": "Answer in the secret code."},
        {"role": "user", "content": "red fox"},
        {"role": "assistant", "content": "tiger apple"},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ]
    sample = tokenize_record({"messages": turns}, "messages", tok, 512)
    assert sample is not None
    # Independently of the trainer: render the template, find each assistant reply by its
    # characters (content, <|im_end|> and the newline the template puts after it), and mark
    # the tokens whose characters lie inside one.
    text = tok.apply_chat_template(turns, tokenize=False)
    assert isinstance(text, str)
    spans = [(m.start(1), m.end(1)) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>\n)", text, re.S)]
    assert len(spans) == 2
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    expected = [any(a <= s and e <= b for a, b in spans) for s, e in enc["offset_mapping"]]
    assert list(sample.input_ids) == enc["input_ids"]
    trained = [label != IGNORE_INDEX for label in sample.labels]
    assert trained == expected, [
        (tok.decode([i]), t) for i, t, x in zip(sample.input_ids, trained, expected, strict=True) if t != x
    ]
    for label, token in zip(sample.labels, sample.input_ids, strict=True):
        assert label in (IGNORE_INDEX, token)
    # Each trained run of tokens is one reply closed by EOS (<|im_end|>) and the newline after it.
    replies = [
        [t for t, _ in g]
        for k, g in groupby(zip(sample.input_ids, trained, strict=True), key=lambda pair: pair[1])
        if k
    ]
    decoded = [tok.decode(r) for r in replies]
    assert decoded == ["tiger apple<|im_end|>\n", "The capital of France is Paris.<|im_end|>\n"]
    assert all(r[-2] == tok.eos_token_id for r in replies)


@pytest.mark.timeout(2400)  # 322 CPU-s: at load 20 in a clean-clone CI run it got a fifth of a core; 1500 s ran out
def test_lora_learns_the_code_keeps_base_weights_and_general_answers(
    tmp_path: Path, smollm2_dir: Path, launch: Callable[..., Run]
) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_operator.api.catalogue import read_entry
    from finetune_operator.plan.counting.param_count import architecture_shape, count_parameters
    from finetune_trainer.data.builtin_datasets import WORDS, secret_code_records

    words = WORDS[:6]  # a small code, learnable in a few dozen CPU steps
    records = [
        {"messages": r["messages"]}
        for r in secret_code_records(4000, seed=5)
        if all(w in words for w in r["input"].split())
    ]
    held_out = [(t, a) for t, a in _code_prompts(words, seed=99, count=12)]
    seen = {r["messages"][1]["content"] for r in records}
    held_out = [(t, a) for t, a in held_out if t not in seen] or held_out[:4]
    data = write_jsonl(tmp_path / "code.jsonl", records)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    before_code = [_generate(base, tok, _code_turns(t), 6) == a for t, a in held_out]
    before_general = [_generate(base, tok, [{"role": "user", "content": q}]).lower() for q, _ in REGRESSION]
    assert not any(before_code), "the base model must not know the made-up code"
    assert all(k in a for (_, k), a in zip(REGRESSION, before_general, strict=True)), before_general

    manifest = job_manifest(
        MODEL_URI,
        str(data),
        "/out",
        dataset={"format": "messages", "maxSeqLength": 48, "validationSplit": 0.0},
        method={"type": "lora", "lora": {"r": 16, "alpha": 32, "dropout": 0.0}},
        training={"maxSteps": 20, "microBatchSize": 8, "globalBatchSize": 16, "learningRate": 0.002},
        output={"uri": "/out", "mergedModel": True},
    )
    out = tmp_path / "out"
    link_model_cache(out, smollm2_dir)
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(2200) == 0, run.log()[-3000:]

    # The trainable/total counts the trainer logs are the planner's, exactly.
    found = re.search(r"lora, (\d+)/(\d+) trainable parameters", run.log())
    assert found, run.log()[-2000:]
    counts = count_parameters(architecture_shape(read_entry("smollm2-135m-instruct")), 16, ["all-linear"])
    assert (int(found[1]), int(found[2])) == (counts.trainable, counts.total)
    assert counts.base_total == sum(p.numel() for p in base.parameters())

    # Frozen means bit-identical: every merged weight LoRA does not target equals the base's.
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter), sorted(adapter)[:5]
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32)
    base_state, merged_state = base.state_dict(), merged.state_dict()
    untargeted = [k for k in base_state if "proj" not in k]
    assert any("embed_tokens" in k for k in untargeted) and any("norm" in k for k in untargeted)
    for key in untargeted:
        assert torch.equal(base_state[key], merged_state[key]), key
    assert not torch.equal(base_state["model.layers.0.self_attn.q_proj.weight"],
                           merged_state["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip

    after_code = [_generate(merged, tok, _code_turns(t), 6) for t, _ in held_out]
    accuracy = sum(g == a for g, (_, a) in zip(after_code, held_out, strict=True)) / len(held_out)
    assert accuracy >= 0.75, list(zip(after_code, held_out, strict=True))
    after_general = [_generate(merged, tok, [{"role": "user", "content": q}]).lower() for q, _ in REGRESSION]
    assert all(k in a for (_, k), a in zip(REGRESSION, after_general, strict=True)), after_general


@pytest.mark.timeout(900)
def test_qlora_trains_the_4bit_model_on_cpu(tmp_path: Path, smollm2_dir: Path, launch: Callable[..., Run]) -> None:
    import torch
    from safetensors.torch import load_file

    from finetune_trainer.data.builtin_datasets import secret_code_records

    data = write_jsonl(tmp_path / "code.jsonl", [{"messages": r["messages"]} for r in secret_code_records(64, seed=3)])
    manifest = job_manifest(
        MODEL_URI,
        str(data),
        "/out",
        dataset={"format": "messages", "maxSeqLength": 48, "validationSplit": 0.0},
        method={"type": "qlora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}, "qlora": {"quantType": "nf4"}},
        training={"maxSteps": 3, "microBatchSize": 4, "globalBatchSize": 4, "precision": "bf16"},
        resources={"numNodes": 1, "gpusPerNode": 0},
    )
    out = tmp_path / "out"
    link_model_cache(out, smollm2_dir)
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(850) == 0, run.log()[-3000:]
    losses = run.losses()
    assert sorted(losses) == [1, 2, 3] and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert lora_b and any(float(t.abs().sum()) > 0 for t in lora_b)
    assert all("lora_" in k for k in adapter)
