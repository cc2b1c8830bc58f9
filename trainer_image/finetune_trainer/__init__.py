"""The trainer that runs inside every pod of a FineTuneJob.

Entry points: `python -m finetune_trainer` (`__main__`: the pod entrypoint, `pod.launch.train`,
as the program `ftjob train` and `ftjob run` start; the operator never imports this package),
`rank.worker` (one DeepSpeed rank), `storage.paths.resolve_uri` (where URIs live in a pod).
The package never imports kopf; torch and DeepSpeed are imported lazily.

Folders by concern: `pod/` (the pod's main process), `rank/` (one training rank), `model/`,
`data/`, `checkpoint/`, `storage/`, `tracking/`, `metrics/`. The modules at this level are the
ground both sides stand on: the config (`settings`), the failures (`errors`) and how a process
ends (`outcome`, `preemption`), plus small helpers. import-linter holds the layers
(pyproject.toml).
"""
