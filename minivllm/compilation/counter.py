"""Counters of what the compilation machinery did, for tests and start-up logs.

Tests read them to assert behaviour that is otherwise invisible: that a second
batch size did not re-trace the model, that a warm cache compiled nothing, that
the graph was split into the expected number of pieces.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager


@dataclasses.dataclass
class CompilationCounter:
    """Monotonic counts, one field per event; compare two snapshots to see a delta."""

    num_models_seen: int = 0
    """Model forwards wrapped for compilation (modes 1-3)."""
    num_dynamo_traces: int = 0
    """Times a torch.compile backend was handed a freshly traced graph."""
    num_graphs_seen: int = 0
    """Whole-model graphs the VLLM_COMPILE backend received."""
    num_piecewise_graphs_seen: int = 0
    """Pieces produced by splitting at the splitting ops (splitting-op pieces excluded)."""
    num_splitting_ops_seen: int = 0
    """Splitting-op nodes found in the traced graphs."""
    num_backend_compilations: int = 0
    """Pieces compiled by Inductor or the eager backend (a cache load does not count)."""
    num_inductor_compilations: int = 0
    """Of those, compilations that ran Inductor."""
    num_cache_loads: int = 0
    """Compiled pieces loaded from the on-disk compile cache."""
    num_cache_saves: int = 0
    """Compiled pieces written to the on-disk compile cache."""
    num_shape_runs: int = 0
    """Split graphs run on fake inputs to find each piece's example inputs (a warm start
    installs the pieces its compile cache recorded instead: ``pieces.json``)."""
    num_aot_loads: int = 0
    """Model forwards loaded from a saved AOT trace (no Dynamo trace that start)."""
    num_aot_saves: int = 0
    """AOT traces of a model forward written next to the compile cache."""
    num_noops_eliminated: int = 0
    """Nodes removed by the eliminate_noops pass."""
    num_cudagraph_captured: int = 0
    """CUDA graphs captured (full or piecewise)."""

    def clone(self) -> CompilationCounter:
        """A snapshot of the current counts."""
        return copy.deepcopy(self)

    def delta(self, since: CompilationCounter) -> dict[str, int]:
        """Fields that changed since ``since``, with their increase."""
        out: dict[str, int] = {}
        for f in dataclasses.fields(self):
            diff = getattr(self, f.name) - getattr(since, f.name)
            if diff:
                out[f.name] = diff
        return out

    @contextmanager
    def expect(self, **expected: int) -> Iterator[None]:
        """Assert that the block increases each named counter by exactly the given amount."""
        before = self.clone()
        yield
        for name, amount in expected.items():
            got = getattr(self, name) - getattr(before, name)
            assert got == amount, f"{name}: expected +{amount}, got +{got}"


compilation_counter = CompilationCounter()
"""The process-wide counter.  It only ever grows; it steers nothing, it is only read."""
