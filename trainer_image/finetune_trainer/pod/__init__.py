"""The pod's main process: what runs before, around and after this node's ranks.

`launch` is the entrypoint (idle when the job is done; otherwise fetch the inputs, start the
node launcher, report the outcome); `prefetch` and `s3_inputs` bring the model and data once
per pod, `download_gate` bounds the download and starts a gang's ranks together,
`node_launcher` starts the ranks without importing torch, `rank_threads` gives each its CPUs,
`process_tree` stops them all. Nothing here imports `rank`: the two meet only through the
launch contract and the files of the state folder (`outcome`, `preemption`).
"""
