"""A real local Kubernetes control plane for tests and the demo."""
