"""Shared fixtures of the trainer tier: a tiny local model, datasets, and a way to run ranks.

Multi-rank tests start the real pod entrypoint (`ftjob train --config DIR`) in a process of
its own (tests/support/training_runs.py), which runs the node launcher and real DeepSpeed gloo
ranks on this CPU. A run is forked from the test process's fork server, which has imported
torch, DeepSpeed and peft once (tests/support/fork_server.py; `fresh=True` or
FTJOB_TEST_FORK_SERVER=0 starts a fresh interpreter instead). Every run gets its own free
rendezvous port and its own output and termination-log paths.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.training_runs import Run, start_train, write_jsonl


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 64-wide Llama with the demo tokenizer, saved like any local model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune_trainer.model.builtin_models import build_tokenizer

    path = tmp_path_factory.mktemp("models") / "tiny"
    tok = build_tokenizer(512)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """`builtin://smollm2-135m-instruct` converted once per machine (`FTJOB_TEST_MODEL_CACHE`, default
    ~/.cache/finetune-operator/models); a run finds it through `link_model_cache`."""
    from finetune_trainer.model.builtin_models import SMOLLM2, materialise_model

    default = Path.home() / ".cache" / "finetune-operator" / "models"
    return materialise_model(SMOLLM2, Path(os.environ.get("FTJOB_TEST_MODEL_CACHE", default)), 0)


@pytest.fixture
def reverse_jsonl(tmp_path: Path) -> Path:
    from finetune_trainer.data.builtin_datasets import reverse_words_records

    rows = [{k: r[k] for k in ("instruction", "input", "output")} for r in reverse_words_records(200, seed=7)]
    return write_jsonl(tmp_path / "reverse.jsonl", rows)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """Collects started runs and kills any left running when the test ends."""
    started: list[Run] = []
    yield started
    for run in started:
        run.kill()


@pytest.fixture
def launch(runs: list[Run]) -> Callable[..., Run]:
    def _launch(config_dir: Path, output: Path, **kwargs: Any) -> Run:
        run = start_train(config_dir, output, **kwargs)
        runs.append(run)
        return run

    return _launch
