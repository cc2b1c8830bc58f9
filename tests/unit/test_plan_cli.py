"""`ftjob plan`: table, JSON, verdicts and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finetune_operator.cli.main import main
from tests.factories import job_document


def write_job(tmp_path: Path, **spec: object) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_document(**spec)))
    return str(path)


QLORA_24GI = {
    "model": {"uri": "meta-llama/Llama-2-7b-hf"},
    "method": {"type": "qlora"},
    "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": 2048},
    "resources": {"gpusPerNode": 1, "gpuMemory": "24Gi"},
}


def test_json_chooses_a_fitting_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", write_job(tmp_path, **QLORA_24GI), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpuMemoryBytes"] == 24 * 2**30
    assert data["chosen"]["perGpuBytes"] <= 0.9 * data["gpuMemoryBytes"]
    assert any(c["fits"] is False and c["reason"].startswith("does not fit by") for c in data["candidates"])


def test_table_has_components_and_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", write_job(tmp_path, **QLORA_24GI)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "weights" in out[1] and "activ" in out[1] and "total" in out[1]
    assert any(line.startswith("* ") for line in out)
    assert " fits: " in out[-1]


@pytest.mark.parametrize(("method", "said"), [({"type": "qlora"}, ", qlora, "), ({"type": "dpo"}, ", dpo on lora, ")])
def test_the_header_names_the_objective_and_the_adaptation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], method: dict[str, str], said: str
) -> None:
    spec = QLORA_24GI | {"method": method}
    if method["type"] == "dpo":
        spec["dataset"] = {"uri": "builtin://secret-code-preference", "format": "preference", "maxSeqLength": 2048}
    assert main(["plan", write_job(tmp_path, **spec)]) == 0
    assert said in capsys.readouterr().out.splitlines()[0]


def test_gpu_memory_flag_overrides_the_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", write_job(tmp_path, **QLORA_24GI), "--json", "--gpu-memory", "80Gi"]) == 0
    assert json.loads(capsys.readouterr().out)["gpuMemoryBytes"] == 80 * 2**30


def test_nothing_fits_exits_1_with_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_job(
        tmp_path,
        **(QLORA_24GI | {"method": {"type": "full"}, "deepspeed": {"zeroStage": 2, "offloadOptimizer": "none"}}),
    )
    assert main(["plan", path, "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["chosen"] is None
    assert "nothing fits" in captured.err and "method.type: lora" in captured.err


def test_unknown_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", write_job(tmp_path, model={"uri": "nobody/nothing"})]) == 2
    assert "not in the planner's catalogue" in capsys.readouterr().err


def test_planner_imports_no_torch_or_kubernetes() -> None:
    code = (
        "import sys, finetune_operator.plan, finetune_operator.cli.plan_cmd;"
        "bad = {'torch', 'transformers', 'kopf', 'kubernetes', 'peft', 'deepspeed'} & set(sys.modules);"
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


CPU_JOB = {
    "model": {"uri": "builtin://tiny-llama"},
    "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": 64},
    "resources": {"numNodes": 2, "gpusPerNode": 0},
}


def test_a_cpu_job_is_described_in_cpu_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_job(tmp_path, **CPU_JOB)
    assert main(["plan", path]) == 0
    plan_out = capsys.readouterr().out
    assert "2 CPU rank(s); GiB per CPU rank" in plan_out.splitlines()[0]
    assert "usable per CPU rank on 2 CPU ranks (budget from resources.gpuMemory 80.0 GiB)" in plan_out
    assert main(["validate", path]) == 0
    validate_out = capsys.readouterr().out
    assert "valid (lora, builtin://tiny-llama, 2 pods × 1 CPU rank)" in validate_out
    assert "GPU" not in validate_out + plan_out.replace("resources.gpuMemory", "")


NEW_BASES = (
    "Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B",
    "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.3-70B-Instruct",
    "google/gemma-3-1b-pt", "google/gemma-3-4b-pt", "google/gemma-3-12b-pt", "google/gemma-3-27b-pt",
    "microsoft/phi-4", "allenai/OLMo-2-1124-7B", "ibm-granite/granite-3.3-8b-instruct", "openai/gpt-oss-20b",
)  # fmt: skip


@pytest.mark.parametrize("hub_id", NEW_BASES)
def test_todays_bases_plan_offline(hub_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26's list: each hub id plans from the catalogue, with no note (its activations are traced-checked)."""
    path = write_job(tmp_path, model={"uri": hub_id}, resources={"numNodes": 1, "gpusPerNode": 8, "gpuMemory": "80Gi"})
    assert main(["plan", path]) == 0
    out = capsys.readouterr().out
    assert "params" in out.splitlines()[0] and " fits: " in out
    assert "note:" not in out


def test_a_family_whose_activations_are_unchecked_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A counted family outside the traced-checked ones plans, and its plan says what the estimate rests on."""
    config = {
        "model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288,
        "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
    }  # fmt: skip
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    path = write_job(tmp_path, model={"uri": str(tmp_path / "model")})
    assert main(["plan", path]) == 0
    assert "note: activations of starcoder2 models are estimated" in capsys.readouterr().out
    assert main(["plan", path, "--json"]) == 0
    assert "--traced" in json.loads(capsys.readouterr().out)["notes"][0]
