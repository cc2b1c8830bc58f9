"""Reading a status that may have been hand-edited into nonsense, without crashing.

The status subresource is writable by anyone with the right verb. The operator must
neither crash-loop on garbage nor lose the counters that bound retries, so each field
is validated on its own and whatever still makes sense is kept; the rest is rebuilt
from the observed children on the next write.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api import reasons as R
from ..api.reasons import ConditionType
from ..api.status import FineTuneJobStatus
from ..api.timestamps import timestamp
from .conditions import headline, set_condition


def salvage_status(raw: Any) -> FineTuneJobStatus | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        return FineTuneJobStatus.from_wire(dict(raw))
    except ValidationError:
        pass
    kept: dict[str, Any] = {}
    for field, info in FineTuneJobStatus.model_fields.items():
        key = info.alias or field
        if key not in raw:
            continue
        try:
            FineTuneJobStatus.from_wire({key: raw[key]})
        except ValidationError:
            continue
        kept[key] = raw[key]
    return FineTuneJobStatus.from_wire(kept)


def invalid_spec_status(
    status: FineTuneJobStatus | None, lines: list[str], body: Mapping[str, Any], now: datetime
) -> FineTuneJobStatus:
    """Failed/InvalidSpec with one problem per line, as `ftjob validate` prints them."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    gen = generation if isinstance(generation, int) else None
    base = status or FineTuneJobStatus()
    message = "; ".join(lines)
    conditions = set_condition(
        list(base.conditions),
        ConditionType.FAILED,
        True,
        reason=R.INVALID_SPEC,
        message=message,
        now=timestamp(now),
        generation=gen,
    )
    return base.model_copy(update={"conditions": conditions, "state": headline(conditions), "observed_generation": gen})
