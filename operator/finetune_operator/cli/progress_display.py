"""The live progress of a job for `ftjob wait` and `ftjob submit --wait`.

On a terminal a tqdm bar: steps done of the total, loss, tokens/s and the ETA the trainer
reports (tqdm's own estimate is left out: after a restart it is wrong). Elsewhere (a CI log, a
pipe) one plain line per change, from `client.views.progress_line`, so logs stay readable.
"""

from __future__ import annotations

from typing import Any, TextIO

from ..api import FineTuneJob
from ..client.views import format_duration, progress_line, state_of

BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class ProgressDisplay:
    """Call it with each version of the job (`wait(on_progress=display)`); `close()` at the end."""

    def __init__(self, stream: TextIO, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self._bar: Any = None
        self._last = ""

    def __call__(self, job: FineTuneJob) -> None:
        if not self.tty:
            line = progress_line(job)
            if line != self._last:
                print(line, file=self.stream, flush=True)
                self._last = line
            return
        self._update_bar(job)

    def _update_bar(self, job: FineTuneJob) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        progress = job.status.progress if job.status else None
        total = progress.total_steps if progress and progress.total_steps else None
        if self._bar is None or (total is not None and self._bar.total != total):
            if self._bar is not None:
                self._bar.close()
            self._bar = tqdm(total=total, file=self.stream, unit="step", dynamic_ncols=True, bar_format=BAR_FORMAT)
        self._bar.set_description_str(f"{job.name} {state_of(job)}", refresh=False)
        postfix = []
        if progress is not None:
            self._bar.n = progress.step
            if progress.loss is not None:
                postfix.append(f"loss {progress.loss:.4f}")
            if progress.tokens_per_second is not None:
                postfix.append(f"{progress.tokens_per_second:,.0f} tok/s")
            if progress.eta_seconds is not None:
                postfix.append(f"ETA {format_duration(progress.eta_seconds)}")
        self._bar.set_postfix_str(", ".join(postfix), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
