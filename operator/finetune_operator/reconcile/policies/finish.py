"""The last phase of a pass: the status the phases built, their events, and Kueue's wrap-up,
as the one `Decision` the reconciler carries out (it writes the status once, if it changed)."""

from __future__ import annotations

from ..decision import Decision, Effects
from . import queueing
from .phases import Inputs
from .status_builder import StatusBuilder


def finish(inputs: Inputs, b: StatusBuilder, effects: Effects) -> Decision:
    status = b.finish()
    effects, finished_workload = queueing.wrap_up(inputs, status.state, effects)
    return Decision.of(effects, status, tuple(b.events), finished_workload)
