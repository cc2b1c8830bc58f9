"""The bench tier: every benchmark's `--smoke` mode, run as a user runs it, with its wall time.

Why: a benchmark is run by hand, rarely; a changed signature or a renamed field breaks it
silently, and a broken one may still print a table of what little it measured. Each test
here runs one script's smallest complete measurement in a subprocess and checks its table.
The wall time of each smoke run is printed at the end of the session (it is CI time, and
the budget is small), never asserted.

The local control plane's binaries are built (cold cache: tens of minutes, with the time
printed) before the first cluster smoke starts, outside any test timeout.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from finetune_localcluster.binaries import ensure_binaries

HERE = Path(__file__).resolve().parent
WALL_TIMES = pytest.StashKey[dict[str, float]]()


def _in_tier(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).parents


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(_in_tier(item) and item.get_closest_marker("cluster") for item in session.items):
        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            ensure_binaries()


@pytest.fixture
def wall_times(request: pytest.FixtureRequest) -> dict[str, float]:
    """Where a smoke test records its run's wall time, by benchmark, for the session summary."""
    return request.config.stash.setdefault(WALL_TIMES, {})


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    times = config.stash.get(WALL_TIMES, {})
    if not times:
        return
    terminalreporter.section("benchmark smoke runs, wall time")
    for name, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    terminalreporter.write_line(f"{sum(times.values()):7.1f} s  total")
