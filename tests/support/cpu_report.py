"""The tests that cost the most CPU, listed after pytest's `--durations` (which lists wall time).

CI runs its tiers side by side on 2 cores, so a run's length is about its CPU time over 2: a
test that waits on a server for minutes costs the run little, one that trains for a minute
costs it a minute. `--cpu-durations=N` lists the N tests with the most CPU seconds: the test
process's own plus that of every process below it, over setup, call and teardown: the ones it
waited for (`getrusage(RUSAGE_CHILDREN)`) and the ones still running, with what they waited for
(/proc: utime, stime, cutime, cstime). A session fixture's servers, such as the local cluster
and the training pods of its process node, are so counted in the tests that ran while they
used the CPU, not all in the last one. Under pytest-xdist each worker measures its own tests
and the controller prints the list.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

_START = pytest.StashKey[float]()
_PROPERTY = "cpu_seconds"


_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> Iterator[int]:
    """Every live process below `pid` (/proc/PID/task/TID/children; none where the kernel lacks it)."""
    pending = [pid]
    while pending:
        for children in Path(f"/proc/{pending.pop()}/task").glob("*/children"):
            try:
                found = [int(child) for child in children.read_text().split()]
            except OSError:  # the task ended meanwhile
                continue
            yield from found
            pending.extend(found)


def _tree_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of the live processes below `pid`, in clock ticks."""
    total = 0
    for child in _descendants(pid):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:  # it ended meanwhile: its parent's cutime or our RUSAGE_CHILDREN has it now
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is fields[0]
        total += sum(int(value) for value in fields[11:15])
    return total


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process and everything below it, so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return waited + _tree_ticks(os.getpid()) / _TICKS


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
