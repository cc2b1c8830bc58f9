"""Checkpoints a kill at any moment cannot corrupt and a re-plan does not lose.

`saves` writes and finds a job's step folders; `portable` and `universal` make one resumable
under another strategy or world size; `s3_checkpoints` commits them to a bucket when the
job's output is on `s3://`.
"""
