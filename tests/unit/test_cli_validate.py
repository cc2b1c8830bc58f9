"""`ftjob validate`: exit codes and one line per problem, through the real entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from finetune_operator.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VALID = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "invalid.yaml")


@pytest.mark.parametrize("example", VALID, ids=[p.name for p in VALID])
def test_every_valid_example_passes(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(example)]) == 0
    assert ": valid (" in capsys.readouterr().out


def test_invalid_example_names_each_bad_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES / "invalid.yaml")]) == 1
    err = capsys.readouterr().err.splitlines()
    fields = [line.split(": ")[1] for line in err]
    for expected in (
        "spec.model.uri",
        "spec.dataset.format",
        "spec.method.lora.r",
        "spec.training.precision",
        "spec.training.learningRate",
        "spec.resources.numNodes",
        "spec.resources.gpuMemory",
        "spec.deepspeed.zeroStage",
        "spec.env[0].name",
    ):
        assert expected in fields, err
    assert len(err) == len(set(err))


def test_multi_document_files_skip_other_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n---\n"
        + (EXAMPLES / "lora-8b-2x8.yaml").read_text()
        + "\n---\n# empty document\n"
    )
    assert main(["validate", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "Namespace (not a FineTuneJob): skipped" in out
    assert "llama3-8b-lora: valid" in out


def _validate_bytes(tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    """`ftjob validate` on a file of these bytes: it must fail; returns the file and stderr."""
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    assert main(["validate", str(path)]) == 1
    return path, capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("key: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        (
            "apiVersion: finetune.dev/v2\nkind: FineTuneJob\nmetadata: {name: a}\n",
            "apiVersion: must be one of 'finetune.dev/v1alpha1'",
        ),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n", "no FineTuneJob found"),
    ],
)
def test_bad_files_get_a_message_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    _, err = _validate_bytes(tmp_path, content.encode(), capsys)
    assert expected in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (  # passes the schema, but the operator would fail it: fused experts take no LoRA dropout
            {"model": "{uri: mistralai/Mixtral-8x7B-v0.1, architecture: mixtral-8x7b}", "lora": "{dropout: 0.05}"},
            "mx: InvalidSpec: spec.method.lora.dropout: 0.05 cannot apply to mixtral-8x7b",
        ),
        ({"model": "{uri: org/unknown-model}", "lora": "{}"}, "mx: InvalidSpec: "),
        (  # offload would need more host memory than the pod may have
            {
                "model": "{uri: meta-llama/Llama-3.1-70B, architecture: llama-3.1-70b}",
                "lora": "{}",
                "gpus": "1, memory: 16Gi",
            },
            "mx: DoesNotFit: ",
        ),
    ],
)
def test_what_the_operator_would_fail_fails_validate_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, str], expected: str
) -> None:
    path = tmp_path / "mx.yaml"
    path.write_text(
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: mx, namespace: ml}\nspec:\n"
        f"  model: {edit['model']}\n  dataset: {{uri: /data/d.jsonl}}\n"
        f"  method: {{type: lora, lora: {edit['lora']}}}\n"
        f"  resources: {{numNodes: 1, gpusPerNode: {edit.get('gpus', '8')}, gpuMemory: 24Gi}}\n"
        "  output: {uri: /out/mx}\n"
    )
    assert main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert expected in captured.err and "Traceback" not in captured.err, captured.err
    assert ": valid (" not in captured.out
    path.write_text(path.read_text().replace("dropout: 0.05", "dropout: 0"))
    if "dropout" in edit["lora"]:
        assert main(["validate", str(path)]) == 0  # the same job with what the message asks for


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/job.yaml"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_scientific_notation_reads_as_a_number_like_kubectl(tmp_path: Path) -> None:
    text = (EXAMPLES / "qlora-7b-24gi.yaml").read_text().replace("learningRate: 2.0e-4", "learningRate: 2e-4")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["validate", "-q", str(path)]) == 0


def test_installed_console_script_runs_torch_free() -> None:
    code = (
        "import sys; from finetune_operator.cli.main import main; rc = main(['validate', '-q', sys.argv[1]]); "
        "assert 'torch' not in sys.modules, 'validate imported torch'; raise SystemExit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLES / "lora-70b-4x8x80gi.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


JOB_HEAD = "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: x}\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (_bomb(9).encode(), "excessive aliasing: 72 YAML aliases expand to more than 100,000 values"),
        (
            (JOB_HEAD + "spec: {deepspeed: {overrides: {a: " + "[" * 3000 + "1" + "]" * 3000 + "}}}\n").encode(),
            "nested too deep to parse",
        ),
        (JOB_HEAD.encode() + b"  labels: {a: \xff\xfe}\n", "not UTF-8 text: byte 0xff at offset"),
        (b"a: " + b"x" * (3 * 1024 * 1024), "larger than 3 MiB: the apiserver refuses requests this big"),
    ],
    ids=["alias-bomb", "deep", "not-utf8", "too-big"],
)
def test_validate_is_total_one_line_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, expected: str
) -> None:
    path, err = _validate_bytes(tmp_path, content, capsys)
    (line,) = err.splitlines()
    assert line.startswith(f"{path}: ") and expected in line, line


def test_a_few_honest_aliases_still_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (EXAMPLES / "tiny-cpu.yaml").read_text()
    assert "metadata:\n  name: tiny-cpu\n" in text
    text = text.replace("metadata:\n", "metadata:\n  labels: {team: &t ml, owner: *t}\n", 1)
    path = tmp_path / "aliases.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
