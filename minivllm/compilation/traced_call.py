"""One guard-free trace of a module's forward, saved and reloaded like the model's.

`minivllm.compilation.wrapper.ModelForward` compiles the model forward, whose
arguments are the token ids and positions.  Other traced forwards (the CPU decode
graph's copy of the model, `minivllm.worker.decode_graph`) take other arguments
but want the same start-up: trace once with Dynamo, compile with a `VllmBackend`,
and, with the compile cache on, save that trace (`minivllm.compilation.aot`) so a
later start loads it instead of tracing.  `trace_once` does that for any module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from minivllm import envs
from minivllm.compilation.aot import AotForward, CanonicalBackend
from minivllm.compilation.backend import VllmBackend
from minivllm.compilation.counter import compilation_counter
from minivllm.compilation.wrapper import private_forward
from minivllm.logger import init_logger

logger = init_logger(__name__)


class _Counted:
    """Counts Dynamo's calls of a backend (``compilation_counter.num_dynamo_traces``)."""

    def __init__(self, backend: Callable[..., Any]) -> None:
        self.backend = backend

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        compilation_counter.num_dynamo_traces += 1
        return self.backend(gm, example_inputs)


def _compile(forward: Callable[..., Any], backend: Callable[..., Any]) -> Any:
    # One trace serves every call: no guards, as the model forward runs.
    return torch.compile(
        forward,
        backend=_Counted(backend),
        fullgraph=True,
        dynamic=False,
        options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe},
    )


def trace_once(
    module: nn.Module,
    backend: VllmBackend,
    example_args: tuple[Any, ...],
    extra_modules: frozenset[str] = frozenset(),
) -> Callable[..., Any]:
    """``module``'s forward compiled by ``backend`` from one trace on ``example_args``
    (their dynamic dimensions marked), run without guards; returns ``fn(*args)``.

    Where ``backend`` has an AOT directory (compile cache on, Inductor,
    ``MINIVLLM_USE_AOT_COMPILE``), the trace saved there by an earlier start with the
    same config, sources and weight shapes is loaded instead of tracing, and a fresh
    trace is saved.  A trace that Dynamo cannot save is only compiled.
    ``extra_modules`` name modules that decide the trace without being traced (the
    caller marking the dynamic dimensions): their sources are part of the check.
    """
    forward = private_forward(module)
    directory = backend.aot_directory() if envs.use_aot_compile() else None
    aot = None
    if directory is not None:
        aot = AotForward(directory, module, forward.__func__.__globals__, backend, extra_modules)
    compiled = _compile(forward, backend if aot is None else CanonicalBackend(backend))
    if aot is None or not hasattr(compiled, "aot_compile"):
        compiled(*example_args)
        return compiled
    fn = aot.load()
    if fn is None:
        try:
            fn = compiled.aot_compile((example_args, {}))
        except Exception as exc:
            logger.warning(
                "AOT compilation of %s failed (%s); not saving its trace", backend.prefix, exc
            )
            logger.debug("AOT compilation failure", exc_info=True)
            plain = _compile(forward, backend)
            plain(*example_args)
            return plain
        aot.save(fn)

    def call(*args: Any) -> Any:
        return fn(module, *args)

    call(*example_args)
    return call


__all__ = ["trace_once"]
