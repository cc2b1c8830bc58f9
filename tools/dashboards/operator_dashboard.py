"""The operator dashboard: is the controller keeping up, failing, and what are the jobs doing?

The `namespace` label of `finetune_operator_jobs` and `finetune_operator_job_restarts_total` is
the job's namespace, written by the operator; the chart's ServiceMonitor sets `honorLabels` so
Prometheus keeps it rather than renaming it `exported_namespace`. Counters that only appear after
a first event (restarts in a namespace the operator was not told about at start-up) fall back to
0 with `or on () vector(0)`: "no restarts" is a value, not missing data.
"""

from __future__ import annotations

from .model import Dashboard, Panel, Row, Target, Variable

CONTROLLER = 'controller="finetunejob"'
NAMESPACE = 'namespace=~"$namespace"'
RATE = "[$__rate_interval]"


def _latency(quantile: float) -> Target:
    return Target(
        f"histogram_quantile({quantile}, sum by (le) "
        f"(rate(finetune_operator_reconcile_time_seconds_bucket{{{CONTROLLER}}}{RATE})))",
        f"p{round(quantile * 100)}",
    )


RECONCILE = Row(
    "Reconciliation",
    (
        Panel(
            "Reconcile rate by result",
            (Target(f"sum by (result) (rate(finetune_operator_reconcile_total{{{CONTROLLER}}}{RATE}))", "{{result}}"),),
            unit="ops",
            stacked=True,
            width=8,
        ),
        Panel(
            "Error ratio",
            (
                Target(
                    f"sum(rate(finetune_operator_reconcile_errors_total{{{CONTROLLER}}}{RATE}))"
                    f" / sum(rate(finetune_operator_reconcile_total{{{CONTROLLER}}}{RATE}))",
                    "errors",
                ),
            ),
            unit="percentunit",
            width=8,
            min_value=0,
            thresholds=((0.05, "red"),),
            description="Reconciliations that raised, over all reconciliations (empty while idle).",
        ),
        Panel("Reconcile latency", (_latency(0.5), _latency(0.99)), unit="s", width=8),
        Panel(
            "Active workers",
            (Target(f"sum(finetune_operator_active_workers{{{CONTROLLER}}})", "workers"),),
            width=8,
            min_value=0,
            description="Reconciliations running right now.",
        ),
        Panel(
            "Operator build",
            (Target("finetune_operator_build_info", "{{version}}"),),
            kind="stat",
            width=4,
            height=8,
        ),
        Panel(
            "Gang restarts in range",
            (
                Target(
                    f"sum(increase(finetune_operator_job_restarts_total{{{NAMESPACE}}}[$__range])) or on () vector(0)",
                    "restarts",
                ),
            ),
            kind="stat",
            width=4,
            height=8,
            thresholds=((1, "orange"),),
        ),
        Panel(
            "Re-plans in range",
            (Target("sum(increase(finetune_operator_replans_total[$__range])) or on () vector(0)", "re-plans"),),
            kind="stat",
            width=8,
            height=8,
            thresholds=((1, "orange"),),
            description="A re-plan follows an out-of-memory failure: the job moved to a more frugal plan.",
        ),
    ),
)

JOBS = Row(
    "Jobs",
    (
        Panel(
            "Jobs by condition",
            (Target(f"sum by (condition) (finetune_operator_jobs{{{NAMESPACE}}})", "{{condition}}"),),
            stacked=True,
            min_value=0,
        ),
        Panel(
            "Restarts and re-plans",
            (
                Target(
                    f"sum by (namespace) (increase(finetune_operator_job_restarts_total{{{NAMESPACE}}}{RATE}))"
                    " or on () vector(0)",
                    "restarts {{namespace}}",
                ),
                Target(f"sum by (reason) (increase(finetune_operator_replans_total{RATE}))", "re-plan: {{reason}}"),
            ),
            min_value=0,
        ),
        Panel(
            "Gang restarts by job",
            (
                Target(
                    f"max by (namespace, finetune_job) (finetune_operator_job_gang_restarts{{{NAMESPACE}}})"
                    " or on () vector(0)",
                    "{{namespace}}/{{finetune_job}}",
                ),
            ),
            min_value=0,
            description="status.restarts of each job: the FineTuneGangRestartLoop alert counts its changes.",
        ),
        Panel(
            "Waiting: time in Pending, Planned or Queued",
            (
                Target(
                    "max by (namespace, finetune_job, state) (time() - "
                    "finetune_operator_job_state_since_timestamp_seconds"
                    f'{{{NAMESPACE}, state=~"Pending|Planned|Queued"}}) or on () vector(0)',
                    "{{namespace}}/{{finetune_job}} {{state}}",
                ),
            ),
            unit="s",
            min_value=0,
            description="How long each job has waited to start: the FineTuneJobQueuedTooLong alert fires past 1h.",
        ),
    ),
)

OPERATOR = Dashboard(
    uid="finetune-operator",
    title="Fine-tuning / Operator",
    description="The finetune-operator controller: reconcile rate, errors, latency, workers, jobs, restarts.",
    tags=("finetune-operator", "operator"),
    variables=(
        Variable(
            "namespace", "Namespace", "label_values(finetune_operator_jobs, namespace)", multi=True, include_all=True
        ),
    ),
    rows=(RECONCILE, JOBS),
)
