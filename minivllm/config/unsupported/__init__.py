"""Sub-configs of `VllmConfig` for subsystems minivllm does not run yet.

Each class takes vLLM's fields with their documented defaults, so configs written for
vLLM load; `check_supported()` refuses any value that would need the subsystem, with
"not supported by minivllm yet: ..." and what to change.  A subsystem moves up to
`minivllm/config/` when the engine makes its settings real.
"""
