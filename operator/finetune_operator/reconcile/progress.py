"""Progress of a running job, read from rank 0's Prometheus endpoint.

The operator already knows the pod IP and metrics port; one small HTTP GET per
interval turns the trainer's gauges into `status.progress` (step, total, epoch, loss,
tokens/s, ETA; for DPO and ORPO the rewards and the preference accuracy, which an SFT trainer
exports as NaN). Anything unreachable or unparsable degrades quietly to "no update", and a
non-finite value (NaN, +-Inf: rank 0's image is user-chosen) is unknown, never an exception
that would stop the status from updating.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from ..api.status import Progress
from ..api.timestamps import timestamp

WANTED = {
    "finetune_train_global_step": "step",
    "finetune_train_max_steps": "total",
    "finetune_train_epoch": "epoch",
    "finetune_train_loss": "loss",
    "finetune_train_preference_accuracy": "preference_accuracy",
    "finetune_train_reward_margin": "reward_margin",
    "finetune_train_reward_chosen": "rewards_chosen",
    "finetune_train_reward_rejected": "rewards_rejected",
    "finetune_eval_preference_accuracy": "eval_preference_accuracy",
    "finetune_train_tokens": "tokens",
    "finetune_train_tokens_total": "tokens",
    "finetune_data_skipped_records": "skipped",
    "finetune_data_skipped_records_total": "skipped",
    "finetune_model_download_bytes": "downloaded",
    "finetune_model_download_total_bytes": "download_total",
    "finetune_checkpoint_resumed_step": "resumed_step",
    "finetune_checkpoint_resume_converted": "converted",
    "finetune_checkpoint_save_duration_seconds_sum": "save_seconds",
    "finetune_checkpoint_save_duration_seconds_count": "saves",
}
GIB = 2**30


@dataclass(frozen=True)
class Sample:
    """The raw numbers of one scrape, kept to compute rates between scrapes."""

    at: float
    values: dict[str, float]


def fetch(url: str, timeout: float = 1.0) -> str | None:
    """Rank 0's /metrics text, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read(2_000_000).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def scrape(url: str, timeout: float = 1.0) -> dict[str, float] | None:
    text = fetch(url, timeout)
    return parse(text) if text is not None else None


def parse(text: str) -> dict[str, float] | None:
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = WANTED.get(sample.name)
                if key is not None and key not in values:
                    value = float(sample.value)
                    if math.isfinite(value):
                        values[key] = value
    except (ValueError, TypeError):
        return None
    return values or None


def _finite(values: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in values.items() if math.isfinite(value)}


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def _download(v: dict[str, float]) -> str | None:
    """`downloading model 3.2/16.0 GiB (20%)` while the pod fetches a hub model (before any rank runs)."""
    if "downloaded" not in v:
        return None
    done, total = v["downloaded"] / GIB, v.get("download_total", 0.0) / GIB
    if total <= 0:
        return f"downloading model {done:.1f} GiB"
    return f"downloading model {done:.1f}/{total:.1f} GiB ({min(100, int(100 * done / total))}%)"


def to_progress(now: datetime, current: Sample, previous: Sample | None) -> Progress:
    v = _finite(current.values)
    before = _finite(previous.values) if previous is not None else {}
    step = int(v.get("step", 0))
    total = int(v["total"]) if v.get("total") else None
    rate = None
    eta = None
    if previous is not None and current.at > previous.at:
        dt = current.at - previous.at
        tokens = v.get("tokens", 0.0) - before.get("tokens", 0.0)
        rate = round(tokens / dt, 2) if tokens >= 0 else None
        steps = step - int(before.get("step", 0))
        if total and steps > 0:
            eta = int((total - step) * dt / steps)
    percent = min(100, int(100 * step / total)) if total else None
    summary = f"{step}/{total} ({percent}%)" if total else _download(v)
    loss = v.get("loss") if step > 0 else None  # before the first step the gauge is only initialised
    trained = v if step > 0 else {}  # a preference step's values, like the loss, from step 1 on
    resumed = int(v["resumed_step"]) if v.get("resumed_step", 0) > 0 else None
    saves = v.get("saves", 0.0)
    save_seconds = round(v.get("save_seconds", 0.0) / saves, 3) if saves > 0 else None
    return Progress(
        step=step,
        total_steps=total,
        epoch=round(v["epoch"], 3) if "epoch" in v else None,
        loss=round(loss, 4) if loss is not None else None,
        preference_accuracy=_rounded(trained.get("preference_accuracy")),
        reward_margin=_rounded(trained.get("reward_margin")),
        rewards_chosen=_rounded(trained.get("rewards_chosen")),
        rewards_rejected=_rounded(trained.get("rewards_rejected")),
        eval_preference_accuracy=_rounded(v.get("eval_preference_accuracy")),  # the evaluation before step 1 counts
        tokens_per_second=rate,
        eta_seconds=eta,
        percent=percent,
        summary=summary,
        skipped_records=int(v["skipped"]) if "skipped" in v else None,
        resumed_from_step=resumed,
        checkpoint_converted=bool(v.get("converted")) if resumed is not None else None,
        checkpoint_save_seconds=save_seconds if save_seconds is None or save_seconds >= 0 else None,
        last_update_time=timestamp(now),
    )
