"""Experiment tracking: every job is one MLflow run for its whole life, with TensorBoard logs beside it.

Rank 0 holds each step's metrics until a checkpoint holds the step, then appends them to a
journal on the output volume (`recorder`, `journal`); the pod's entrypoint publishes the journal
to each sink from threads of its own (`session`, `publisher`, `mlflow_sink`,
`tensorboard_sink`), so a slow or absent server never costs a step, and a resumed gang never
publishes a step twice. Rank 0's metrics endpoint tells the operator about the run (`status`).
"""
