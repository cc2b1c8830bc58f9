"""What serves a job's result (`spec.serving`), rendered as pure functions of the job and its
`status.result`: KServe's InferenceService or LLMInferenceService, or a vLLM Deployment and Service."""
