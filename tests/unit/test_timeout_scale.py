"""FTJOB_TEST_TIMEOUT_SCALE multiplies every bound a test waits under: pytest-timeout's (a test's
nearest `timeout` marker, else the ini default) and the local tooling's waits (`wait_for`)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_localcluster.kube import WAIT_SCALE_ENV, wait_for, wait_scale
from tests.support.timeouts import scaled_timeout


@pytest.mark.parametrize(("value", "scale"), [(None, 1.0), ("3", 3.0), ("2.5", 2.5), ("0.5", 1.0), ("x", 1.0)])
def test_the_scale_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str | None, scale: float
) -> None:
    if value is None:
        monkeypatch.delenv(WAIT_SCALE_ENV, raising=False)
    else:
        monkeypatch.setenv(WAIT_SCALE_ENV, value)
    assert wait_scale() == scale


def _item(*args: Any) -> Any:
    marker = SimpleNamespace(args=args) if args else None
    return SimpleNamespace(get_closest_marker=lambda name: marker if name == "timeout" else None)


def test_a_marker_or_the_default_is_scaled_and_nothing_else() -> None:
    assert scaled_timeout(_item(300), default=120, scale=3) == 900
    assert scaled_timeout(_item(), default=120, scale=3) == 360  # no marker: the ini default
    assert scaled_timeout(_item(300), default=120, scale=1) is None  # nothing to change
    assert scaled_timeout(_item(0), default=120, scale=3) is None  # timeout(0): no bound at all


@pytest.mark.timeout(7)
def test_this_tests_own_timeout_is_scaled(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args[0] == pytest.approx(7 * wait_scale())


def test_wait_for_waits_the_scaled_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WAIT_SCALE_ENV, "3")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 1s waiting for nothing"):
        wait_for(lambda: None, 0.4, "nothing", interval=0.05)
    assert time.monotonic() - started >= 1.2
