"""The one time format of the API: RFC 3339 in UTC, to the second (`2026-11-29T12:00:00Z`).

Every time the operator writes into a status (conditions, start and completion, progress,
failures, Kueue's Workload conditions) goes through `timestamp`, and every one it reads back
through `parse_timestamp`, which also takes the offsets and fractions other writers use.
"""

from __future__ import annotations

from datetime import UTC, datetime

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def timestamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime(TIME_FORMAT)


def parse_timestamp(text: str | None) -> datetime | None:
    """The time `text` stands for; None when it is empty or no RFC 3339 time."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
