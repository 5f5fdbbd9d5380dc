"""`ProfilerConfig`: the on-demand profiler (``/start_profile``, ``/stop_profile``)."""

from __future__ import annotations

from typing import Literal

from minivllm.config.utils import config, hash_factors

ProfilerKind = Literal["torch", "cuda", "proton"]


@config
class ProfilerConfig:
    """Configuration for profiling."""

    profiler: ProfilerKind | None = None
    """Which profiler runs between start and stop: "torch" (torch.profiler,
    traces written to ``torch_profiler_dir``), "cuda" (cudaProfilerStart/Stop
    for Nsight Systems) or None. "proton" (Triton) is not supported."""
    torch_profiler_dir: str = ""
    """Directory for torch.profiler traces; required with profiler="torch"."""
    torch_profiler_with_stack: bool = True
    """Record Python stacks."""
    torch_profiler_with_flops: bool = False
    """Estimate FLOPs of matmuls and convolutions."""
    torch_profiler_use_gzip: bool = True
    """Gzip the trace files."""
    torch_profiler_dump_cuda_time_total: bool = True
    """Write a table of total CUDA time per op."""
    torch_profiler_record_shapes: bool = False
    """Record input shapes of each op."""
    torch_profiler_with_memory: bool = False
    """Record tensor allocations."""
    ignore_frontend: bool = False
    """Profile only the engine core, not the API frontend."""
    delay_iterations: int = 0
    """Engine steps to skip after start before recording."""
    max_iterations: int = 0
    """Stop after this many recorded steps (0: until stop)."""
    proton_mode: str | None = None
    """Proton profiling mode (only with profiler="proton"; unsupported)."""
    proton_graph_attribution: bool = False
    """Attribute replayed CUDA-graph kernels in Proton (unsupported)."""

    def __post_init__(self) -> None:
        if self.delay_iterations < 0 or self.max_iterations < 0:
            raise ValueError("delay_iterations and max_iterations must be >= 0")
        self.check_supported()

    def check_supported(self) -> None:
        """Proton is not available; the torch profiler needs a directory."""
        if self.profiler == "proton" or self.proton_mode or self.proton_graph_attribution:
            raise ValueError(
                "the Proton profiler is not supported by minivllm; use profiler='torch' or 'cuda'"
            )
        if self.profiler == "torch" and not self.torch_profiler_dir:
            raise ValueError(
                "profiler='torch' needs torch_profiler_dir, the directory traces are written to"
            )

    def compute_hash(self) -> str:
        """Profiling does not change the compiled graph: no factors."""
        return hash_factors([])
