"""One training rank, as the node launcher starts it (`worker`).

`rank_setup` builds what the rank needs before step 1, `loop` is the `Trainer` (data →
DeepSpeed engine → checkpoints → evaluation → artefacts), with `evaluation`, `schedule`,
`devices` (which device a tensor belongs on) and `collective_check` (a test-run guard on
collectives). Nothing here imports `pod`.
"""
