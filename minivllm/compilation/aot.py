"""Ahead-of-time compiled forward: VLLM_COMPILE's Dynamo trace kept on disk.

The compile cache spares a second start the Inductor work, but Dynamo would still
trace the whole model every start (seconds for a 30-layer model).  With
``use_aot_compile`` (``MINIVLLM_USE_AOT_COMPILE``, on by default) the first start
saves what Dynamo produced next to the compiled pieces: the guard-free bytecode
that feeds the model's parameters and inputs to the compiled graph, and the graph
itself.  A later start with the same config loads that file, splits the graph again
and takes every piece from the compile cache, without tracing anything.

Two details keep the saved trace honest:

- The graph that gets compiled is always the *unpickled* copy of what Dynamo
  traced, on the first start too.  Pickling normalises some details (how a piece
  receives the symbolic token count), so compiling the copy everywhere makes the
  first and every later start build identical pieces that share cache entries.
- The trace is only valid for the source it was made from.  The hash of every
  module Dynamo read is stored beside it; a start whose sources differ (an edited
  model file, a new minivllm) traces again and replaces the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._dynamo.aot_compile_types import SerializableCallable

from minivllm.compilation.counter import compilation_counter
from minivllm.logger import init_logger

logger = init_logger(__name__)

AOT_FILE = "aot_forward.bin"
SOURCES_FILE = "aot_forward.sources.json"

_loading_backend: list[Callable[[fx.GraphModule, list[Any]], Any]] = []
"""The backend that compiles a graph being loaded (a stack: loads may nest in tests)."""


def _dump_graph(gm: fx.GraphModule) -> bytes:
    """Pickle ``gm``, keeping of its metadata only the inputs' example values.

    ``gm`` itself is left as it was: Dynamo reads its placeholders' metadata (their
    ``grapharg``) after the backend returns, unless it traces for an AOT save.
    """
    from torch.fx._graph_pickler import GraphPickler, Options

    saved = [(node, dict(node.meta)) for node in gm.graph.nodes]
    shape_env = gm.__dict__.pop("shape_env", None)
    try:
        for node, meta in saved:
            keep = ("example_value", "val") if node.op == "placeholder" else ()
            node.meta = {k: _without_view_base(meta[k]) for k in keep if k in meta}
        return GraphPickler.dumps(gm, Options(ops_filter=None))
    finally:
        for node, meta in saved:
            node.meta = meta
        if shape_env is not None:
            gm.__dict__["shape_env"] = shape_env


def _without_view_base(value: Any) -> Any:
    """``value``, or a fake tensor of its size, strides and dtype that is no view.

    A parameter may be a view of another tensor (a low-bit kernel's weight layout is
    a reshaped view of the tensor it was packed in).  The pickler describes a view's
    base with the fake mode it lives in, which holds weak references and cannot be
    pickled.  The compiled pieces read only an input's size, strides and dtype, and
    the model's weights never alias each other, so the base is of no use to them.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(value, FakeTensor) or not value._is_view():
        return value
    with value.fake_mode:
        plain = torch.empty_strided(
            value.shape, value.stride(), dtype=value.dtype, device=value.device
        )
    return plain.requires_grad_(value.requires_grad)


def _load_graph(data: bytes) -> tuple[fx.GraphModule, list[Any], Any]:
    """The graph of `_dump_graph`, its example inputs and the fake mode they live in."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    gm = GraphPickler.loads(data, fake_mode)
    inputs = [
        node.meta.get("example_value", node.meta.get("val"))
        for node in gm.graph.nodes
        if node.op == "placeholder"
    ]
    return gm, inputs, fake_mode


def _compile_graph(backend: Callable[..., Any], data: bytes) -> CompiledForward:
    from torch._guards import TracingContext, tracing

    gm, inputs, fake_mode = _load_graph(data)
    with tracing(TracingContext(fake_mode)):
        return CompiledForward(data, backend(gm, inputs))


class CompiledForward(SerializableCallable):
    """The compiled graph of the forward, serialisable as the graph it came from."""

    def __init__(self, graph_data: bytes, compiled: Callable[..., Any]) -> None:
        self.graph_data = graph_data
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: Any) -> bytes:
        return fn.graph_data

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        if not _loading_backend:
            raise RuntimeError("an AOT forward can only be loaded through AotForward.load")
        return _compile_graph(_loading_backend[-1], data)


class CanonicalBackend:
    """What Dynamo calls: compiles the pickled-and-unpickled copy of its graph."""

    def __init__(self, backend: Callable[..., Any]) -> None:
        self.backend = backend

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> CompiledForward:
        return _compile_graph(self.backend, _dump_graph(gm))


@contextlib.contextmanager
def _backend_for_loading(backend: Callable[..., Any]) -> Iterator[None]:
    _loading_backend.append(backend)
    try:
        yield
    finally:
        _loading_backend.pop()


def source_hashes(modules: set[str]) -> dict[str, str]:
    """sha256 of each named module's source file ("" when it has none)."""
    hashes = {}
    for name in sorted(modules):
        try:
            path = importlib.import_module(name).__file__
            hashes[name] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""
        except (ImportError, OSError):
            hashes[name] = ""
    return hashes


TENSORS_KEY = "<model tensors>"
"""Entry of the sources file for `tensor_signature`: a trace bakes in the shapes and
dtypes of the weights it read, which the weights' form (e.g. a low-bit kernel's
layout) changes without any traced source changing."""


def tensor_signature(model: torch.nn.Module) -> str:
    """sha256 of the name, shape and dtype of every parameter and buffer."""
    lines = [
        f"{name}:{tuple(t.shape)}:{t.dtype}"
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if t is not None
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


class AotForward:
    """The saved forward of one model: `load` it, or `save` a fresh AOT trace.

    ``backend`` compiles a loaded graph (the model's `VllmBackend`; the trace being
    saved must have gone through `CanonicalBackend` around the same backend).  The
    loaded function is called as ``fn(model, *args)``.
    """

    def __init__(
        self,
        directory: Path,
        model: torch.nn.Module,
        f_globals: dict[str, Any],
        backend: Callable[..., Any],
        extra_modules: frozenset[str] = frozenset(),
    ) -> None:
        self.path = directory / AOT_FILE
        self.sources_path = directory / SOURCES_FILE
        self.model = model
        self.f_globals = f_globals
        self.backend = backend
        self.extra_modules = extra_modules
        """Modules that shape the trace without being traced (the caller that marks the
        example inputs' dynamic dimensions): a trace saved without them, or with
        other sources of them, is traced again."""

    def load(self) -> Any | None:
        """The saved forward, or None (none saved, sources changed, or unreadable)."""
        if not self.path.is_file() or not self.sources_path.is_file():
            return None
        try:
            saved = json.loads(self.sources_path.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("unreadable %s (%s); tracing the model again", self.sources_path, exc)
            return None
        if not self.extra_modules <= set(saved) or (
            self._signature(set(saved) - {TENSORS_KEY}) != saved
        ):
            logger.info(
                "model source or weights changed since %s was saved; tracing again", self.path
            )
            return None
        try:
            with open(self.path, "rb") as f, _backend_for_loading(self.backend):
                fn = torch.compiler.load_compiled_function(
                    f, f_globals=self.f_globals, external_data={"model": self.model}
                )
        except Exception as exc:  # an incompatible or corrupt file is only a miss
            logger.warning("could not load %s (%s); tracing the model again", self.path, exc)
            return None
        fn.disable_guard_check()
        compilation_counter.num_aot_loads += 1
        logger.info("loaded the AOT-compiled forward from %s (no Dynamo trace)", self.path)
        return fn

    def _signature(self, modules: set[str]) -> dict[str, str]:
        return {**source_hashes(modules), TENSORS_KEY: tensor_signature(self.model)}

    def save(self, fn: Any) -> None:
        """Write ``fn`` and the hashes of the sources it was traced from."""
        modules = {src.module for src in fn.source_info().inlined_sources}
        modules.add(type(self.model).__module__)
        modules |= self.extra_modules
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.sources_path.with_suffix(f".tmp{os.getpid()}")
            fn.save_compiled_function(str(self.path), external_data={"model": self.model})
            tmp.write_text(json.dumps(self._signature(modules), indent=1))
            os.replace(tmp, self.sources_path)
        except Exception as exc:  # the forward still runs; the next start traces again
            logger.warning("could not save the AOT-compiled forward to %s (%s)", self.path, exc)
            return
        compilation_counter.num_aot_saves += 1


__all__ = [
    "AOT_FILE",
    "AotForward",
    "CanonicalBackend",
    "CompiledForward",
    "source_hashes",
    "tensor_signature",
]
