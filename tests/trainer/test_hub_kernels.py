"""Every model the trainer loads keeps transformers' own layers: no kernels from the Hub.

transformers 5 kernelizes a model in `from_pretrained` unless told not to (the `kernels`
package is installed with bitsandbytes). On the first GPU acceptance run that made every
ZeRO-3 and QLoRA case fail at load ("Version 2 of 'kernels-community/rotary' is not available
in the local cache and Hugging Face Hub is in offline mode"); with the Hub in reach it would
have run downloaded inference kernels in a training job. On CPU the same default marks the
model `use_kernels` (in inference mode), which is what these tests read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.training_runs import METHODS, job_manifest

pytestmark = [pytest.mark.trainer]


def base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_the_trainer_loads_its_model_without_hub_kernels(tiny_model_dir: Path, method: str) -> None:
    from finetune_operator.api.job import FineTuneJob
    from finetune_operator.plan import fixed_plan
    from finetune_trainer.model import modeling

    manifest = job_manifest(
        str(tiny_model_dir), "/unused.jsonl", "/out", method=METHODS[method], training={"precision": "bf16"}
    )
    spec = FineTuneJob.from_manifest(manifest).spec
    model = modeling.load_model(spec, fixed_plan(spec), str(tiny_model_dir), modeling.compute_settings(spec, False))
    base = base_model(model)
    assert base.use_kernels is False, f"{method}: transformers kernelized the model ({base._kernels_mode})"


def test_the_merged_export_loads_its_base_without_hub_kernels(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_trainer.model.export import save_merged

    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), use_kernels=False)
    adapter = tmp_path / "adapter"
    get_peft_model(plain, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(str(adapter))
    loaded: list[Any] = []
    original = AutoModelForCausalLM.from_pretrained

    def recording(*args: Any, **kwargs: Any) -> Any:
        model = original(*args, **kwargs)
        loaded.append(model)
        return model

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    out = save_merged(str(tiny_model_dir), adapter, tokenizer, tmp_path / "merged", "bfloat16")
    assert (out / "config.json").exists()
    assert len(loaded) == 1 and loaded[0].use_kernels is False
