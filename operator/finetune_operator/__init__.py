"""finetune-operator: plan, render and run distributed LLM fine-tuning on Kubernetes."""
