"""minivllm."""
