"""Torch code that the trainer and the operator's traced planner must run identically.

The operator never imports the trainer and the API stays torch-free, yet the traced planner
(`finetune_operator.plan.search.traced`) has to measure the very step a rank runs. What both sides
execute therefore lives here, in a package that is neither: it imports torch and the API
(`finetune_operator.api`), nothing of the operator's other layers and nothing of the trainer
(import-linter holds both). It sits in the `operator/` folder so that both images carry it;
only code that already has torch imports it.

- `chunked_loss`: the causal-LM loss through the LM head in chunks of tokens.
"""
