"""Fixtures shared by every tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import REPO_ROOT


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
