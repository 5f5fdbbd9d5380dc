"""Compiling the model forward at one call site, as ``CompilationConfig.mode`` says.

The model code stays plain; `build_model_forward` returns the callable the model
runner runs instead of ``model(input_ids, positions)``:

- ``NONE``: the model itself, eager.
- ``STOCK_TORCH_COMPILE``: ``torch.compile`` with ``CompilationConfig.backend``;
  Dynamo keeps its guards and recompiles as it sees fit.
- ``DYNAMO_TRACE_ONCE``: one trace with the token dimension dynamic and every
  guard dropped, so no batch size ever re-traces (the model must not branch on
  the token count).  ``dynamic_shapes_config.evaluate_guards`` keeps the guards
  instead and makes a re-trace an error, to find where a model specialises.
- ``VLLM_COMPILE``: the same single trace, handed to `VllmBackend`.  With the
  compile cache on, the trace itself is saved too and later starts load it instead
  of running Dynamo (`minivllm.compilation.aot`).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from minivllm import envs
from minivllm.compilation.aot import AotForward, CanonicalBackend
from minivllm.compilation.backend import VllmBackend, init_backend
from minivllm.compilation.counter import compilation_counter
from minivllm.config.compilation.dynamic_shapes import DynamicShapesType
from minivllm.config.compilation.modes import CompilationMode
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


class RecompilationError(RuntimeError):
    """A trace-once mode was asked to trace a second time."""


class _CountingBackend:
    """Forwards to the real backend, counting (and, for trace-once modes, policing) traces."""

    def __init__(self, backend: Any, trace_once: bool, strict: bool) -> None:
        self.backend = backend
        self.trace_once = trace_once
        self.strict = strict
        self.num_traces = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.num_traces += 1
        compilation_counter.num_dynamo_traces += 1
        if self.trace_once and self.num_traces > 1:
            msg = (
                "the model was traced a second time under a trace-once compilation mode; "
                "it has control flow that depends on the batch size. Use mode "
                "STOCK_TORCH_COMPILE or remove the shape-dependent branch."
            )
            if self.strict:
                raise RecompilationError(msg)
            logger.warning(msg)
        if isinstance(self.backend, str):
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend(self.backend)(gm, example_inputs)
        return self.backend(gm, example_inputs)


class ModelForward:
    """``forward(input_ids, positions) -> hidden`` of a model, compiled per the config."""

    def __init__(self, model: nn.Module, vllm_config: VllmConfig, prefix: str = "model") -> None:
        self.model = model
        self.vllm_config = vllm_config
        compilation_config = vllm_config.compilation_config
        self.mode = CompilationMode(compilation_config.mode or CompilationMode.NONE)
        self.dynamic_type = compilation_config.dynamic_shapes_config.type
        self.backend: Any = None
        self.counting: _CountingBackend | None = None
        self._fn: Callable[..., torch.Tensor] = model
        self._aot: AotForward | None = None
        self._aot_fn: Callable[..., torch.Tensor] | None = None
        if self.mode == CompilationMode.NONE:
            return
        compilation_counter.num_models_seen += 1
        strict = compilation_config.dynamic_shapes_config.evaluate_guards
        # A saved trace runs without guards, so evaluate_guards rules it out.
        allow_aot = envs.use_aot_compile() and not strict
        self.backend = init_backend(vllm_config, prefix=prefix, use_aot_compile=allow_aot)
        trace_once = self.mode != CompilationMode.STOCK_TORCH_COMPILE
        backend = self.backend
        forward = private_forward(model)
        directory = self.backend.aot_directory() if isinstance(self.backend, VllmBackend) else None
        if directory is not None:
            backend = CanonicalBackend(self.backend)
            self._aot = AotForward(directory, model, forward.__func__.__globals__, self.backend)
        self.counting = _CountingBackend(backend, trace_once, strict)
        options: dict[str, Any] = {}
        if trace_once and not strict:
            options["guard_filter_fn"] = torch.compiler.skip_all_guards_unsafe
        self._fn = torch.compile(
            forward, backend=self.counting, fullgraph=True, dynamic=False, options=options or None
        )
        if self._aot is not None and not hasattr(self._fn, "aot_compile"):
            logger.info(
                "torch %s has no AOT compile API: the Dynamo trace is not saved", torch.__version__
            )
            self._stop_aot()

    def _stop_aot(self) -> None:
        """Trace as usual from now on, with the plain backend and nothing saved."""
        assert self.counting is not None
        self.counting.backend = self.backend
        self.counting.num_traces = 0
        self._aot = None

    @property
    def is_compiled(self) -> bool:
        return self.mode != CompilationMode.NONE

    @property
    def num_traces(self) -> int:
        """Dynamo traces so far (0 for eager)."""
        return 0 if self.counting is None else self.counting.num_traces

    def _mark_token_dim(self, *tensors: torch.Tensor) -> None:
        # Marking matters only for the call that traces; later calls skip the cost.
        for t in tensors:
            if self.dynamic_type == DynamicShapesType.UNBACKED:
                torch._dynamo.decorators.mark_unbacked(t, 0)
            elif t.shape[0] >= 2:
                # A backed symbol cannot start at 0/1, which Dynamo specialises.
                torch._dynamo.mark_dynamic(t, 0)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._aot_fn is not None:
            return self._aot_fn(self.model, input_ids, positions)
        if self.is_compiled and (
            self.mode == CompilationMode.STOCK_TORCH_COMPILE or self.num_traces == 0
        ):
            self._mark_token_dim(input_ids, positions)
            if self._aot is not None:
                self._aot_fn = self._load_or_trace_aot(self._aot, input_ids, positions)
                if self._aot_fn is not None:
                    return self._aot_fn(self.model, input_ids, positions)
        return self._fn(input_ids, positions)

    def _load_or_trace_aot(
        self, aot: AotForward, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> Callable[..., torch.Tensor] | None:
        """The saved forward, else a fresh AOT trace that gets saved; None if Dynamo
        cannot AOT-compile here (the plain compiled call then traces as usual)."""
        fn = aot.load()
        if fn is not None:
            return fn
        try:
            fn = self._fn.aot_compile(((input_ids, positions), {}))
        except Exception as exc:
            logger.warning("AOT compilation failed (%s); compiling without saving the trace", exc)
            # What could not be saved is deep in the trace: the traceback names it.
            logger.debug("AOT compilation failure", exc_info=True)
            self._stop_aot()
            return None
        aot.save(fn)
        return fn


def private_forward(model: nn.Module) -> Callable[..., torch.Tensor]:
    """``model.forward`` bound to a code object of its own.

    Dynamo keeps its compiled entries on the code object, shared by every instance of
    the model class.  Several engines in one process (tests, a draft model) would
    then pile entries onto one code object until Dynamo's recompile limit fails the
    build, and with guards dropped one model could even run another's graph.  A
    private copy of the code keeps each compiled forward's cache to itself.
    """
    func = type(model).forward
    code = func.__code__
    tag = f"{code.co_name}_minivllm_{id(model):x}"
    private = types.FunctionType(
        code.replace(co_name=tag, co_qualname=f"{code.co_qualname}_{tag}"),
        func.__globals__,
        tag,
        func.__defaults__,
        func.__closure__,
    )
    private.__kwdefaults__ = func.__kwdefaults__
    return types.MethodType(private, model)


def build_model_forward(
    model: nn.Module, vllm_config: VllmConfig, prefix: str = "model"
) -> ModelForward:
    """The forward the model runner calls, compiled as ``vllm_config.compilation_config``
    says (see the module docstring)."""
    return ModelForward(model, vllm_config, prefix=prefix)


def timed_first_call(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes (a warm-up that triggers compilation)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


__all__ = [
    "ModelForward",
    "RecompilationError",
    "build_model_forward",
    "private_forward",
    "timed_first_call",
]
