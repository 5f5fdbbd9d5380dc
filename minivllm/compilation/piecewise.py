"""`PiecewiseBackend`: one compiled piece, specialised per token-count range and size.

At trace time a piece is compiled once per compile range (with the symbolic token
count, so one kernel serves the whole range).  A size listed in ``compile_sizes``
gets its own static-shape compilation, made the first time that size runs (the
model runner warms every compile size up at start-up).  At run time the exact
size wins over the range that contains it: the smaller entry is the more
specialised one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from minivllm.compilation.compiler import PieceCompiler
from minivllm.config.compilation import Range


def _find_token_dim(example_args: list[Any]) -> tuple[int, int | None]:
    """Where the runtime token count can be read from the piece's arguments.

    Returns ``(arg index, None)`` for a SymInt argument, ``(arg index, 0)`` for a
    tensor whose first dimension is symbolic.
    """
    for i, a in enumerate(example_args):
        if isinstance(a, torch.SymInt):
            return i, None
    for i, a in enumerate(example_args):
        if isinstance(a, torch.Tensor) and a.dim() > 0 and isinstance(a.shape[0], torch.SymInt):
            return i, 0
    return -1, None


def _sorted_ranges(compile_ranges: list[Range]) -> list[Range]:
    # Smaller ranges first so lookup finds the most specialised one.
    return sorted(compile_ranges or [Range(1, 1 << 62)], key=lambda r: r.end - r.start)


def _label(r: Range) -> str:
    return f"range_{r.start}_{r.end}"


class PiecewiseBackend:
    """Runs one piece, choosing the compiled entry for the batch's token count."""

    def __init__(
        self,
        graph: fx.GraphModule,
        piece_index: int,
        example_args: list[Any],
        compiler: PieceCompiler,
        compile_ranges: list[Range],
        compile_sizes: list[int],
    ) -> None:
        ranges = _sorted_ranges(compile_ranges)
        keys = [compiler.key(graph, example_args, _label(r)) for r in ranges]
        entries = [
            (r, compiler.compile(graph, example_args, _label(r), dynamic=True, key=key))
            for r, key in zip(ranges, keys, strict=True)
        ]
        token = _find_token_dim(example_args)
        self._assign(graph, piece_index, compiler, token, keys, entries, compile_sizes)

    def _assign(
        self,
        graph: fx.GraphModule,
        piece_index: int,
        compiler: PieceCompiler,
        token: tuple[int, int | None],
        range_keys: list[str],
        range_entries: list[tuple[Range, Callable[..., Any]]],
        compile_sizes: list[int],
    ) -> None:
        self.graph = graph
        self.piece_index = piece_index
        self.compiler = compiler
        self.token_arg, self.token_dim = token
        self.range_keys = range_keys
        self.range_entries = range_entries
        self.size_entries: dict[int, Callable[..., Any] | None] = dict.fromkeys(compile_sizes)

    def record(self) -> dict[str, Any]:
        """What `from_record` needs to rebuild this piece without example inputs."""
        return {
            "index": self.piece_index,
            "token": [self.token_arg, self.token_dim],
            "keys": self.range_keys,
        }

    @classmethod
    def from_record(
        cls,
        graph: fx.GraphModule,
        record: dict[str, Any],
        compiler: PieceCompiler,
        compile_ranges: list[Range],
        compile_sizes: list[int],
    ) -> PiecewiseBackend | None:
        """The piece whose entries `record` names, every one loaded from the compile
        cache; None when one is missing (the caller then compiles as usual)."""
        ranges = _sorted_ranges(compile_ranges)
        keys = record["keys"]
        if len(keys) != len(ranges):
            return None
        entries = []
        for r, key in zip(ranges, keys, strict=True):
            fn = compiler.load(graph, key)
            if fn is None:
                return None
            entries.append((r, fn))
        piece = cls.__new__(cls)
        token_arg, token_dim = record["token"]
        piece._assign(
            graph,
            int(record["index"]),
            compiler,
            (token_arg, token_dim),
            list(keys),
            entries,
            compile_sizes,
        )
        return piece

    def runtime_size(self, args: tuple[Any, ...]) -> int | None:
        """The token count of this call, or None when the piece has no token dimension."""
        if self.token_arg < 0:
            return None
        value = args[self.token_arg]
        return int(value) if self.token_dim is None else int(value.shape[self.token_dim])

    def entry_for(self, args: tuple[Any, ...]) -> Callable[..., Any]:
        """The compiled callable that serves this call's token count."""
        size = self.runtime_size(args)
        if size is not None and size in self.size_entries:
            fn = self.size_entries[size]
            if fn is None:
                fn = self.compiler.compile(self.graph, list(args), f"size_{size}", dynamic=False)
                self.size_entries[size] = fn
            return fn
        if size is not None:
            for r, fn in self.range_entries:
                if size in r:
                    return fn
        # Above every range (only warm-up runs go there): the symbolic graph still fits.
        return self.range_entries[-1][1]

    def __call__(self, *args: Any) -> Any:
        return self.entry_for(args)(*args)


__all__ = ["PiecewiseBackend"]
