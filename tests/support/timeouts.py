"""Scaling the tests' timeouts (FTJOB_TEST_TIMEOUT_SCALE; see finetune_localcluster.kube.wait_scale)."""

from __future__ import annotations

import pytest


def scaled_timeout(item: pytest.Item, default: float, scale: float) -> float | None:
    """The pytest-timeout bound of `item` times `scale` (its nearest `timeout` marker, else the
    ini default); None when there is nothing to scale (no bound, or a scale of 1)."""
    marker = item.get_closest_marker("timeout")
    seconds = float(marker.args[0]) if marker is not None and marker.args else default
    if scale <= 1.0 or seconds <= 0:
        return None
    return seconds * scale
