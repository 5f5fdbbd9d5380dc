"""minivllm's own compiled kernels (C++ built on first use, cached on disk)."""
