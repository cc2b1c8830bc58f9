"""The typed hand-overs between the phases of one lifecycle pass (`lifecycle.decide`).

A pass starts from `Inputs`. Each gate either ends it, returning the `Effects` of stopping
there, or hands the next gate what it established: the plan, then an `Admission` (not
suspended, admitted by Kueue or not queued), then a `Cleared` pass (the deadline not
reached). The gang phase turns a `Cleared` pass and the observed pods into the `Gang`
verdict, and each worker policy is a function of that verdict returning an `Action` on the
workers, or None to leave it to the next. Since each phase takes the output of the one
before it, mypy checks their order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ...api.job import FineTuneJob
from ...api.status import PlanStatus, Progress
from ..decision import Effects, Planner, Replanner
from ..observed import Observed, PodView
from ..tracking import TrackingReport
from .status_builder import StatusBuilder


@dataclass(frozen=True)
class Inputs:
    """What one pass knows: the job, its observed children, the clock, and the planner to call."""

    job: FineTuneJob
    observed: Observed
    now: datetime
    planner: Planner
    replanner: Replanner
    desired_config_hash: Callable[[PlanStatus], str]
    progress: Progress | None
    """Rank 0's progress from its metrics (None: not scraped this pass)."""
    tracking: TrackingReport | None
    """Rank 0's report on the job's experiment tracking, from this pass's scrape (None: no news)."""
    queue: str | None
    """The Kueue LocalQueue the job waits in (None: the job is not queued)."""

    @property
    def nodes(self) -> int:
        return self.job.spec.resources.num_nodes

    def stop(
        self, plan: PlanStatus | None, placement: dict[str, str] | None = None, requeue_after: float | None = None
    ) -> Effects:
        """The effects of ending the pass before the workers run: none of them, the plan kept;
        `requeue_after`: seconds until the pass is worth running again (None: on the next event)."""
        return Effects(replicas=0, plan=plan, placement=placement or {}, requeue_after=requeue_after)


@dataclass(frozen=True)
class Admission:
    """A planned job allowed to run now: not suspended, and admitted by Kueue if it is queued."""

    plan: PlanStatus
    placement: dict[str, str]
    """nodeLabels of the ResourceFlavors Kueue admitted the job on (empty when not queued)."""


@dataclass(frozen=True)
class Cleared:
    """Every gate passed: the workers run, until the deadline if there is one."""

    admission: Admission
    requeue_after: float | None
    """Seconds until the deadline passes (None: no deadline)."""


@dataclass(frozen=True)
class Action:
    """What a worker policy does with the workers."""

    replicas: int
    plan: PlanStatus
    delete_pods: bool
    """Delete every pod of the gang (a gang restart, or pods left over from a failed gang)."""


@dataclass(frozen=True)
class Gang:
    """The gang verdict: the pods of the current gang and how many of them are ready.

    Pods created before the last counted failure belong to the gang that failed (`stale`):
    they are not part of `pods`, and the pass deletes them (again)."""

    inputs: Inputs
    cleared: Cleared
    pods: tuple[PodView, ...]
    ready: int
    stale: bool

    @property
    def plan(self) -> PlanStatus:
        return self.cleared.admission.plan

    @property
    def nodes(self) -> int:
        return self.inputs.nodes

    def keep(self) -> Action:
        """Every rank runs under the plan; pods of a failed gang still go."""
        return Action(replicas=self.nodes, plan=self.plan, delete_pods=self.stale)

    def scale_down(self) -> Action:
        """No rank runs any more (the job ended); the plan stays for the record."""
        return Action(replicas=0, plan=self.plan, delete_pods=self.stale)

    def restart(self, plan: PlanStatus) -> Action:
        """Every rank restarts together, under `plan`, from the last checkpoint."""
        return Action(replicas=self.nodes, plan=plan, delete_pods=True)

    def effects(self, action: Action) -> Effects:
        return Effects(
            replicas=action.replicas,
            plan=action.plan,
            placement=self.cleared.admission.placement,
            delete_pods=action.delete_pods,
            requeue_after=self.cleared.requeue_after,
        )


WorkerPolicy = Callable[[Gang, StatusBuilder], Action | None]
"""A policy on the running gang: the action it takes, or None to leave the gang to the next."""
