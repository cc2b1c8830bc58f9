"""PNG pictures of the key training panels, drawn from what a real Prometheus scraped.

Why not screenshots of Grafana: no Grafana runs here, and the README should show numbers
from a real run rather than a mock-up. The queries below are the dashboard's own PromQL (or
its instant-vector form for bar charts), evaluated through Prometheus' HTTP API, and drawn
with matplotlib's Agg backend (no display needed). Four pictures: loss, tokens/s, model state
by component next to the planner's prediction, and the share of step time in collectives by op.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PNG_NAMES = ("loss.png", "tokens_per_second.png", "memory_vs_plan.png", "comm_share.png")
MODEL_STATE_PLAN = {
    "weights (frozen)": "weights",
    "weights (trainable)": "trainable_weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer_states",
}


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    times: list[float]
    values: list[float]


class Prometheus:
    """The two HTTP API calls the pictures need."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def instant(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self._get("/api/v1/query", params)
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._get("/api/v1/query_range", params)
        return [
            Series(item["metric"], [float(t) for t, _ in item["values"]], [float(v) for _, v in item["values"]])
            for item in data["result"]
        ]


def run_span(prom: Prometheus, selector: str, lookback_s: int = 3600) -> tuple[float, float]:
    """First and last scrape time of the selected trainers' step gauge in the last `lookback_s` seconds."""
    now = time.time()
    first = prom.instant(f"min(min_over_time(timestamp(finetune_train_global_step{{{selector}}})[{lookback_s}s:1s]))")
    last = prom.instant(f"max(max_over_time(timestamp(finetune_train_global_step{{{selector}}})[{lookback_s}s:1s]))")
    if not first or not last or math.isnan(first[0][1]):
        raise RuntimeError(f"no finetune_train_global_step{{{selector}}} in the last {lookback_s}s")
    return first[0][1], min(last[0][1], now)


def _figure(title: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.0), dpi=110)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _line_panel(series: Sequence[Series], start: float, titles: tuple[str, str], path: Path) -> Path:
    fig, ax = _figure(*titles)
    for s in series:
        points = [(t - start, v) for t, v in zip(s.times, s.values, strict=True) if math.isfinite(v)]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=s.labels.get("finetune_job", "run"))
    ax.set_xlabel("seconds since the first scrape of the run")
    if any(s.values for s in series):
        ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def _mib(value: float) -> float:
    return value / 2**20


def memory_panel(prom: Prometheus, selector: str, at: float, path: Path) -> Path:
    measured: dict[str, float] = {}
    for labels, value in prom.instant(
        "max by (component, trainable) (sum by (rank, component, trainable) "
        f"(finetune_model_state_bytes{{{selector}}}))",
        at,
    ):
        name = labels["component"]
        if name == "weights":
            name = f"weights ({'trainable' if labels.get('trainable') == 'true' else 'frozen'})"
        measured[name] = measured.get(name, 0.0) + value
    planned = {labels["component"]: v for labels, v in prom.instant(
        f"max by (component) (finetune_planned_memory_bytes{{{selector}}})", at)}  # fmt: skip
    names = list(MODEL_STATE_PLAN)
    fig, ax = _figure("Model state per rank by component vs plan", "MiB")
    xs = range(len(names))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [_mib(measured.get(n, 0.0)) for n in names], width, label="measured")
    ax.bar(
        [x + width / 2 for x in xs],
        [_mib(planned.get(MODEL_STATE_PLAN[n], 0.0)) for n in names],
        width,
        label="planned",
        hatch="//",
        alpha=0.7,
    )
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.legend(fontsize=8)
    ax.text(
        0.01, 0.97, "measured: real tensors of the fullest rank; planned: status.plan.breakdown\n"
        "(a CPU run computes in the job's precision, as the plan counts it)",
        transform=ax.transAxes, fontsize=7, va="top",
    )  # fmt: skip
    return _save(fig, path)


def comm_panel(prom: Prometheus, selector: str, start: float, end: float, path: Path) -> Path:
    window = f"{max(2, math.ceil(end - start))}s"
    share = prom.instant(
        f"sum by (op) (increase(finetune_comm_duration_seconds_sum{{{selector}}}[{window}]))"
        f" / ignoring (op) group_left sum(increase(finetune_train_step_duration_seconds_sum{{{selector}}}[{window}]))",
        end,
    )
    per_step = {
        labels["op"]: v
        for labels, v in prom.instant(
            f"sum by (op) (increase(finetune_comm_bus_bytes_total{{{selector}}}[{window}]))"
            f" / ignoring (op) group_left sum(increase(finetune_train_steps_total{{{selector}}}[{window}]))",
            end,
        )
    }
    rows = sorted(((labels["op"], v) for labels, v in share if math.isfinite(v) and v > 0), key=lambda r: -r[1])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 4.0), dpi=110)
    ops = [op for op, _ in rows] or ["(none)"]
    left.barh(ops, [100 * v for _, v in rows] or [0.0])
    left.set_xlabel("% of step time (exposed, all ranks)")
    left.set_title("Share of step time in collectives")
    left.invert_yaxis()
    right.barh(ops, [_mib(per_step.get(op, 0.0)) for op in ops], color="tab:orange")
    right.set_xlabel("MiB per step per rank (bus bytes)")
    right.set_title("Bus bytes per step by op")
    right.invert_yaxis()
    for ax in (left, right):
        ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def render_all(url: str, out: Path, namespace: str = ".*", job: str = ".*", lookback_s: int = 3600) -> list[Path]:
    prom = Prometheus(url)
    selector = f'namespace=~"{namespace}", finetune_job=~"{job}"'
    start, end = run_span(prom, selector, lookback_s)
    step = max(1.0, (end - start) / 300)
    window = f"{max(5, math.ceil(4 * step))}s"
    out.mkdir(parents=True, exist_ok=True)
    started = f"max by (finetune_job) (finetune_train_global_step{{{selector}}}) > 0"  # the gauge reads 0 before
    loss = prom.range(
        f"avg by (finetune_job) (finetune_train_loss{{{selector}}}) and on (finetune_job) ({started})", start, end, step
    )
    tokens = prom.range(
        f"sum by (finetune_job) (rate(finetune_train_tokens_total{{{selector}}}[{window}]))", start, end, step
    )
    return [
        _line_panel(loss, start, ("Training loss", "loss"), out / PNG_NAMES[0]),
        _line_panel(tokens, start, (f"Tokens/s (all ranks, rate over {window})", "tokens/s"), out / PNG_NAMES[1]),
        memory_panel(prom, selector, end, out / PNG_NAMES[2]),
        comm_panel(prom, selector, start, end, out / PNG_NAMES[3]),
    ]
