"""The job lifecycle, one phase or policy per module, run in order by `lifecycle.decide`.

Gates (`ttl`, `planning`, `suspend`, `queueing`, `deadline`) either end the pass with the
`Effects` of stopping or hand the next one what they established; `gang` gives the verdict on
the current gang; the worker policies (`success`, `failure`, `config_change`, `waiting`) are
functions of that verdict; `finish` turns the built status into the `Decision`. What each
phase takes and gives is typed in `phases`. `child_write` amends a decision when the
reconciler could not write a child. A new worker policy is a new module and one line in
`lifecycle.WORKER_POLICIES`.
"""
