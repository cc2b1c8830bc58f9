"""A pod toleration, as in the core API: shared by spec.resources and spec.podTemplate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import QUALIFIED_NAME_PATTERN, ApiModel, LabelValue


class Toleration(ApiModel):
    """A pod toleration, as in the core API."""

    key: Annotated[str, Field(max_length=317, pattern=QUALIFIED_NAME_PATTERN)] | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None
