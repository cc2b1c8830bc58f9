"""Reading a model's config.json and weight bytes from the hub or a folder, with a verdict.

Both the operator (a public hub model) and the inspector pod (`ftjob inspect-model`: a model on
a claim, or a hub model read with the job's token) call these. They read only what planning
needs: config.json, and the sizes of the files a trainer pod downloads (the hub's file listing,
or the folder's files), never the weights themselves. Every way it can go wrong becomes a
`ModelInspection` failure with a reason the operator turns into a condition, and a message that
names the field to fix.
"""

from __future__ import annotations

import json
import tempfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from finetune_operator.api.model_cache import DOWNLOADED_PATTERNS
from finetune_operator.api.model_inspection import ModelInspection
from finetune_operator.api.model_uri import HubModel
from finetune_operator.api.reasons import (
    HUB_UNREACHABLE,
    MODEL_ACCESS_DENIED,
    MODEL_GATED,
    MODEL_NOT_FOUND,
    NOT_CAUSAL_LM,
)

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""Class-name endings of the architectures transformers' AutoModelForCausalLM builds."""
HUB_TIMEOUT_SECONDS = 10.0
TOKEN_FIELD = "spec.hfTokenSecretRef"


def downloaded(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch(name, pattern) for pattern in DOWNLOADED_PATTERNS)


def not_causal(config: dict[str, Any]) -> str | None:
    """Why a config.json is no causal language model (by its `architectures`), or None."""
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        return None
    names = [str(a) for a in architectures]
    if any(name.endswith(CAUSAL_SUFFIXES) for name in names):
        return None
    return (
        f"its architectures ({', '.join(names)}) are not causal language models: the operator fine-tunes models "
        "transformers loads with AutoModelForCausalLM (names ending in ForCausalLM)"
    )


def _verdict(origin: str, config: Any, weight_bytes: int, commit: str | None) -> ModelInspection:
    if not isinstance(config, dict):
        return ModelInspection.failed(origin, MODEL_NOT_FOUND, f"{origin}: config.json is not a JSON object")
    why = not_causal(config)
    if why is not None:
        return ModelInspection.failed(origin, NOT_CAUSAL_LM, f"{origin}: {why}")
    return ModelInspection(origin=origin, config=config, weight_bytes=weight_bytes, commit=commit)


def read_folder(folder: Path, origin: str) -> ModelInspection:
    """config.json and the downloadable files' bytes of a model folder (a claim's, inside the inspector)."""
    config_path = folder / "config.json"
    if not folder.is_dir():
        return ModelInspection.failed(origin, MODEL_NOT_FOUND, f"{origin}: no such folder on the claim")
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        return ModelInspection.failed(
            origin, MODEL_NOT_FOUND, f"{origin}: no config.json in the folder (not a transformers model folder)"
        )
    except (OSError, ValueError) as exc:
        return ModelInspection.failed(origin, MODEL_NOT_FOUND, f"{origin}: cannot read config.json: {exc}")
    files = [p for p in folder.rglob("*") if p.is_file() and downloaded(p.name)]
    if not any(p.name.endswith(".safetensors") for p in files):
        return ModelInspection.failed(
            origin, MODEL_NOT_FOUND, f"{origin}: no *.safetensors weights in the folder (the trainer loads safetensors)"
        )
    return _verdict(origin, config, sum(p.stat().st_size for p in files), None)


def read_hub(model: HubModel, *, endpoint: str, token: str | None, token_source: str = "") -> ModelInspection:
    """config.json and the downloaded files' bytes of a hub model, through the real `huggingface_hub` client.

    `token_source` says where the token came from, for messages (`spec.hfTokenSecretRef (hf-token/token)`).
    """
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    origin = f"hub:{model}"
    where = f"{model.repo} on {endpoint}"
    held = token_source or TOKEN_FIELD
    try:
        info = HfApi(endpoint=endpoint).model_info(
            model.repo, revision=model.revision_or_default, files_metadata=True, token=token or False,
            timeout=HUB_TIMEOUT_SECONDS,
        )  # fmt: skip
        commit = info.sha
        origin = f"hub:{model.repo}@{commit}" if commit else origin
        with tempfile.TemporaryDirectory(prefix="ftjob-config-") as cache:
            path = hf_hub_download(
                model.repo, "config.json", revision=commit or model.revision_or_default, endpoint=endpoint,
                token=token or False, cache_dir=cache, etag_timeout=HUB_TIMEOUT_SECONDS,
            )  # fmt: skip
            config = json.loads(Path(str(path)).read_text())
    except GatedRepoError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if token and status == 403:
            return ModelInspection.failed(
                origin, MODEL_ACCESS_DENIED,
                f"{where} is gated and the account of the token in {held} is not on its access list: request "
                f"access at {endpoint}/{model.repo}, or use another account's token",
            )  # fmt: skip
        return ModelInspection.failed(
            origin, MODEL_GATED,
            f"{where} is gated: set {TOKEN_FIELD} to a Secret key holding a hub token of an account with access "
            f"(request it at {endpoint}/{model.repo})",
        )  # fmt: skip
    except RevisionNotFoundError:
        return ModelInspection.failed(
            origin, MODEL_NOT_FOUND,
            f"{where} has no revision {model.revision_or_default!r}: fix spec.model.revision (or the uri's @revision)",
        )  # fmt: skip
    except RepositoryNotFoundError:
        private = "" if token else f" or is private (then set {TOKEN_FIELD})"
        return ModelInspection.failed(origin, MODEL_NOT_FOUND, f"spec.model.uri: {where} does not exist{private}")
    except RemoteEntryNotFoundError:
        return ModelInspection.failed(
            origin, MODEL_NOT_FOUND, f"spec.model.uri: {where} has no config.json (not a transformers model)"
        )
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status == 401 and token:
            return ModelInspection.failed(
                origin, MODEL_ACCESS_DENIED, f"{endpoint} refused the token in {held}: {_first_line(exc)}"
            )
        if status >= 500 or status in (408, 429):
            return ModelInspection.failed(origin, HUB_UNREACHABLE, f"{endpoint} answered {status} for {model.repo}")
        return ModelInspection.failed(origin, MODEL_NOT_FOUND, f"{where}: {_first_line(exc)}")
    except (OSError, ValueError) as exc:
        if _is_network_error(exc):
            return ModelInspection.failed(origin, HUB_UNREACHABLE, f"{endpoint} is unreachable: {_first_line(exc)}")
        return ModelInspection.failed(origin, MODEL_NOT_FOUND, f"{where}: cannot read config.json: {exc}")
    except Exception as exc:  # httpx2's transport errors are no OSError
        if _is_network_error(exc):
            return ModelInspection.failed(origin, HUB_UNREACHABLE, f"{endpoint} is unreachable: {_first_line(exc)}")
        raise
    files = [(s.rfilename, int(s.size or 0)) for s in info.siblings or []]
    if not any(name.endswith(".safetensors") for name, _ in files):
        return ModelInspection.failed(
            origin, MODEL_NOT_FOUND, f"{where} has no *.safetensors weights (the trainer downloads safetensors only)"
        )
    return _verdict(origin, config, sum(size for name, size in files if downloaded(name)), commit)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:400] if lines else type(exc).__name__


def _is_network_error(exc: BaseException) -> bool:
    """A connection refused, reset or timed out (httpx2's and the standard library's)."""
    import httpx2

    return isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError))
