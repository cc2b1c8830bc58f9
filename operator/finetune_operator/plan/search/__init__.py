"""The strategy search: every allowed strategy (`candidates`) evaluated for memory (`memory`,
`activations`; `traced` measures the activation peak on fake tensors) and speed (`comm`), the
choice and its explanation (`planner`), what would fit when nothing does (`advice`), the re-plan
after an out-of-memory failure (`replan`), and a plan taken literally (`fixed`).
"""
