"""The trainer that runs inside every pod of a FineTuneJob.

Entry points: `python -m finetune_trainer` (`__main__`: the pod entrypoint, `launch.train`,
as the program `ftjob train` and `ftjob run` start; the operator never imports this package),
`worker` (one DeepSpeed rank), `paths.resolve_uri` (where URIs live in a pod). The package
never imports kopf; torch and DeepSpeed are imported lazily.
"""
