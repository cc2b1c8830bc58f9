"""The job lifecycle, one policy per module, applied in order by `lifecycle.decide`.

Each policy is a function of a `Context` that returns the `Decision` ending the pass, or
None to hand on to the next. The gates run first (finished, planning, suspend, deadline);
then `gang` looks at the workers and the worker policies refine its decision (success,
failure and re-plan, config change, waiting). A new policy is a new module and one line in
`lifecycle.POLICIES`.
"""
