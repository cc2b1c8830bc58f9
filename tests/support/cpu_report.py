"""The tests that cost the most CPU, listed after pytest's `--durations` (which lists wall time).

CI runs its tiers side by side on 2 cores, so a run's length is about its CPU time over 2: a
test that waits on a server for minutes costs the run little, one that trains for a minute
costs it a minute. `--cpu-durations=N` lists the N tests with the most CPU seconds: the test
process's own, plus every child process it started and waited for (ranks, launchers, servers;
`getrusage(RUSAGE_CHILDREN)`), over setup, call and teardown. A session fixture's processes
are counted in the teardown of the last test that used them. Under pytest-xdist each worker
measures its own tests and the list is printed by the controller.
"""

from __future__ import annotations

import resource
from collections.abc import Generator

import pytest

_START = pytest.StashKey[float]()
_PROPERTY = "cpu_seconds"


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process and its waited-for children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N tests that used the most CPU seconds (with their children)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    if call.when == "teardown" and _START in item.stash:
        # before the report is made: it copies user_properties, which xdist sends to the controller
        item.user_properties.append((_PROPERTY, cpu_seconds() - item.stash[_START]))
    return (yield)


class CpuReport:
    """Collects each test's CPU seconds from its teardown report, wherever the test ran."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == _PROPERTY and isinstance(value, float):
                self.seconds[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        ranked = sorted(self.seconds.items(), key=lambda pair: pair[1], reverse=True)
        total = sum(self.seconds.values())
        terminalreporter.write_sep("=", f"most CPU {self.count} (of {total:.0f} CPU-s in {len(ranked)} tests)")
        for nodeid, seconds in ranked[: self.count]:
            terminalreporter.write_line(f"{seconds:8.1f} CPU-s  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    count = int(config.getoption("--cpu-durations"))
    if count > 0 and not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(CpuReport(count), "cpu-report")
