"""The Helm values page: every documented key of values.yaml with its default and meaning.

The tables come from tools.chart_docs, which also writes them into the chart's README, so
the chart and the docs site show the same text from the same comments.
"""

from __future__ import annotations

from tools.chart_docs import CHART, reference


def page() -> str:
    values_yaml = (CHART / "values.yaml").read_text()
    intro = (
        "# Helm values\n\n"
        "Every value of `charts/finetune-operator/values.yaml`, its default and the comment that "
        "documents it. Set them with `--set key=value` or `-f my-values.yaml`; "
        "`values.schema.json` refuses unknown keys and wrong types.\n\n"
    )
    return intro + reference(values_yaml).replace("### ", "## ")
