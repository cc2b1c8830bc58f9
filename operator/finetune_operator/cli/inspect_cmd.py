"""`ftjob inspect-model`: the entrypoint of the operator's model inspector pod.

Reads a model's config.json and the sizes of the files a trainer pod downloads, from a folder
(a claim, mounted read-only) or from the hub with the token in HF_TOKEN (from the job's
`hfTokenSecretRef`, through `secretKeyRef`), checks that the image's transformers knows the
model_type and builds it as a causal LM, and writes the verdict (`api.model_inspection`) to
`--output` (the termination message). It exits 0 whenever it wrote a verdict, failure included:
the operator reads the verdict, not the exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..api.model_inspection import ModelInspection
from ..api.model_uri import HubModel
from ..api.reasons import NOT_CAUSAL_LM, UNKNOWN_MODEL_TYPE


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--folder", type=Path, help="a model folder (a claim's, mounted read-only)")
    where.add_argument("--hub", metavar="ORG/NAME", help="a hub repo id (endpoint: HF_ENDPOINT, token: HF_TOKEN)")
    parser.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    parser.add_argument("--origin", default=None, help="how to name the folder in messages (pvc://claim/path)")
    parser.add_argument("--token-source", default="", help="where HF_TOKEN came from, for messages")
    parser.add_argument("--output", type=Path, default=None, help="where to write the verdict (default: stdout only)")


def transformers_verdict(config: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when this image's transformers cannot build the model as a causal LM, else None."""
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # an image without transformers: the planner's own check stands
        return None
    model_type = str(config.get("model_type", ""))
    version = transformers.__version__
    if config.get("auto_map") and not model_type:
        return None  # remote code: transformers' mapping cannot say
    if model_type not in CONFIG_MAPPING_NAMES:
        return UNKNOWN_MODEL_TYPE, (
            f"model_type {model_type!r} is unknown to transformers {version} in the trainer image: use an image with "
            "a transformers that knows it (spec.image), or a model of a known type"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return NOT_CAUSAL_LM, (
            f"model_type {model_type!r} has no causal-LM class in transformers {version} (AutoModelForCausalLM "
            "cannot build it): the operator fine-tunes causal language models"
        )
    return None


def inspect(args: argparse.Namespace) -> ModelInspection:
    from ..plan.sources.model_files import read_folder, read_hub

    if args.folder is not None:
        result = read_folder(args.folder, args.origin or str(args.folder))
    else:
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        token = os.environ.get("HF_TOKEN") or None
        result = read_hub(HubModel(args.hub, args.revision), endpoint=endpoint, token=token,
                          token_source=args.token_source)  # fmt: skip
    if result.config is not None:
        verdict = transformers_verdict(result.config)
        if verdict is not None:
            return ModelInspection.failed(result.origin, verdict[0], f"{result.origin}: {verdict[1]}")
    return result


def run(args: argparse.Namespace) -> int:
    result = inspect(args)
    message = result.to_message()
    if args.output is not None:
        args.output.write_text(message)
    if result.failure:
        print(f"{result.failure}: {result.message}", file=sys.stderr, flush=True)
    else:
        model_type = (result.config or {}).get("model_type")
        print(f"ok: {result.origin}: {model_type}, {result.weight_bytes} bytes", flush=True)
    return 0
