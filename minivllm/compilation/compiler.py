"""Compiling one piece of the split graph with Inductor or the eager backend.

`PieceCompiler` is the only place that calls into a compiler, so its counters
are the truth about what a start-up compiled: identical pieces (every middle
decoder layer has the same graph, only its weight inputs differ) are compiled
once and shared, and a piece found in the on-disk cache is loaded, not compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx

from minivllm.compilation.cache import CompileCache
from minivllm.compilation.counter import compilation_counter
from minivllm.logger import init_logger

logger = init_logger(__name__)


@contextlib.contextmanager
def unseeded_random() -> Iterator[None]:
    """Python's ``random`` freshly seeded from the OS inside the block, its state
    restored after.

    Where AOTAutograd cannot key a graph (every piece of a graph loaded from an AOT
    trace) it keys the entry with ``random.random()``, meant as a nonce: a lookup
    under it should always miss.  But the engine seeds ``random`` (``seed``, 0 by
    default), so the nonce repeated from process to process, and a piece was looked
    up among another graph's entries: at best a ``KeyError`` from their guards (the
    compile then fell back and its trace was not saved), at worst another graph's
    code whose guards happened to hold.  Drawing it from a fresh seed keeps it a
    nonce, and the caller's sequence of draws is unchanged."""
    state = random.getstate()
    random.seed()
    try:
        yield
    finally:
        random.setstate(state)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"T({value.dtype},{tuple(value.shape)},{value.stride()},{value.device.type})"
    if isinstance(value, torch.SymInt | int):
        return f"I({value})"
    return type(value).__name__


def graph_key(gm: fx.GraphModule, example_args: list[Any], label: str) -> str:
    """A hash of what the piece computes, independent of its node and input names.

    Two decoder layers produce pieces that differ only in the names of their weight
    placeholders; renaming every node to its position makes them hash alike.
    """
    index: dict[fx.Node, int] = {}
    lines = [f"label={label}", f"torch={torch.__version__}"]

    def ref(a: Any) -> Any:
        return fx.node.map_arg(a, lambda n: f"%{index[n]}")

    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        target = node.target
        if node.op == "placeholder":
            name = "input"  # an input's name (which layer's weight) is not what it computes
        elif isinstance(target, str):
            name = target  # get_attr keeps its name: the attribute's value is baked in
        else:
            name = getattr(target, "__qualname__", str(target))
        mod = getattr(target, "__module__", "")
        lines.append(f"{node.op}|{mod}.{name}|{ref(node.args)!r}|{ref(node.kwargs)!r}")
    lines += [_describe(a) for a in example_args]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]


def _match_output_structure(gm: fx.GraphModule, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``fn`` return what ``gm`` returns: a loaded artifact returns a flat list."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returns_tuple = isinstance(output.args[0], tuple | list)

    def call(*args: Any) -> Any:
        result = fn(*args)
        if isinstance(result, list | tuple):
            return tuple(result) if returns_tuple else result[0]
        return result

    return call


class PieceCompiler:
    """Compiles pieces for one model, sharing results in memory and on disk."""

    def __init__(
        self,
        use_inductor: bool,
        inductor_config: dict[str, Any],
        cache: CompileCache | None,
    ) -> None:
        self.use_inductor = use_inductor
        self.inductor_config = dict(inductor_config)
        self.cache = cache
        self._compiled: dict[str, Callable[..., Any]] = {}
        self.compile_seconds = 0.0

    def key(self, gm: fx.GraphModule, example_args: list[Any], label: str) -> str:
        """The entry key of ``gm`` for ``label`` ("range_1_512", "size_8")."""
        return graph_key(gm, example_args, f"{label}|inductor={self.use_inductor}")

    def compile(
        self,
        gm: fx.GraphModule,
        example_args: list[Any],
        label: str,
        dynamic: bool,
        key: str | None = None,
    ) -> Callable[..., Any]:
        """A callable running ``gm``; ``label`` names the shape entry ("range_1_512",
        "size_8"); ``dynamic`` keeps the tracing context's symbolic sizes; ``key``, if
        the caller has it, is `key` of the same arguments."""
        key = key or self.key(gm, example_args, label)
        fn = self.load(gm, key)
        if fn is None:
            start = time.perf_counter()
            fn = self._compile(gm, example_args, key, dynamic)
            self.compile_seconds += time.perf_counter() - start
            self._compiled[key] = fn
        return fn

    def load(self, gm: fx.GraphModule, key: str) -> Callable[..., Any] | None:
        """The entry ``key`` of ``gm`` if it was made in this process or is in the
        on-disk cache, else None (compiles nothing)."""
        if key in self._compiled:
            return self._compiled[key]
        if not (self.use_inductor and self.cache is not None):
            return None
        start = time.perf_counter()
        loaded = self.cache.load(key)
        self.compile_seconds += time.perf_counter() - start
        if loaded is None:
            return None
        compilation_counter.num_cache_loads += 1
        fn = _match_output_structure(gm, loaded)
        self._compiled[key] = fn
        return fn

    def _compile(
        self, gm: fx.GraphModule, example_args: list[Any], key: str, dynamic: bool
    ) -> Callable[..., Any]:
        compilation_counter.num_backend_compilations += 1
        if not self.use_inductor:
            return gm
        from torch._inductor import standalone_compile

        compilation_counter.num_inductor_compilations += 1
        # Our own key (`graph_key`) identifies the piece, so AOTAutograd need not derive
        # one: for a graph loaded from an AOT trace it cannot (its symbols have no
        # Dynamo sources), and without an AOTAutograd entry the artifact cannot be
        # saved.  These are the settings Dynamo's own AOT compilation uses.
        with (
            unseeded_random(),
            torch._functorch.config.patch(
                bypass_autograd_cache_key=True,
                bundled_autograd_cache=True,
                force_autograd_cache=True,
            ),
        ):
            artifact = standalone_compile(
                gm,
                example_args,
                dynamic_shapes="from_tracing_context" if dynamic else "from_example_inputs",
                options={"config_patches": self.inductor_config},
            )
        if self.cache is not None:
            try:
                self.cache.save(key, artifact)
                compilation_counter.num_cache_saves += 1
            except Exception as exc:  # a full disk must not stop the engine
                logger.warning("could not save compiled piece to the compile cache: %s", exc)
        return artifact


__all__ = ["PieceCompiler", "graph_key"]
