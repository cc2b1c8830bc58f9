"""The trainer that runs inside every pod of a FineTuneJob.

Entry points: `launch.train(config_dir)` (the pod entrypoint behind `ftjob train` and
`ftjob run`), `worker` (one DeepSpeed rank), `paths.resolve_uri` (where URIs live in a
pod). The package never imports kopf; torch and DeepSpeed are imported lazily.
"""
