"""Pure renderers: a validated FineTuneJob and its plan in, manifests and files out.

No clock, no random names, no I/O; the same input always renders the same bytes.
"""
