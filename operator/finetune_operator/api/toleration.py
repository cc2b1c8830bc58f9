"""A pod toleration, as in the core API: shared by spec.resources and spec.podTemplate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel


class Toleration(ApiModel):
    """A pod toleration, as in the core API."""

    key: Annotated[str, Field(max_length=253)] | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: Annotated[str, Field(max_length=63)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None
