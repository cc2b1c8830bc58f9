"""The one-command demo (README's first command): a real cluster, the chart, a real run."""
