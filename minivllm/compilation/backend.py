"""`VllmBackend`: the torch.compile backend of CompilationMode.VLLM_COMPILE.

Dynamo hands it the model's forward traced once with a symbolic token count.
It runs the PassConfig passes, splits the graph at ``splitting_ops`` and
replaces each piece between them by a `PiecewiseBackend` that holds the
compiled code for every compile range and compile size.  Splitting ops stay
eager (attention reads the step's metadata); on CUDA each piece can be wrapped
for piecewise CUDA graph capture.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

from minivllm import envs
from minivllm.compilation.cache import CompileCache, local_cache_dir
from minivllm.compilation.compiler import PieceCompiler
from minivllm.compilation.counter import compilation_counter
from minivllm.compilation.passes import run_passes
from minivllm.compilation.piecewise import PiecewiseBackend
from minivllm.compilation.split import SplitItem, split_graph
from minivllm.config.compilation import CompilationMode, resolve_obj_by_qualname
from minivllm.kernels.inductor_isa import settle_vec_isa
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


class _PieceInstaller(torch.fx.Interpreter):
    """Runs the split module on fake inputs and swaps each piece for its compiled form.

    Running it is what gives every piece its example inputs (with the symbolic token
    count), in execution order.
    """

    def __init__(
        self,
        module: fx.GraphModule,
        names: set[str],
        make_piece: Callable[[str, fx.GraphModule, list[Any]], Callable[..., Any]],
        fake_mode: Any,
    ) -> None:
        super().__init__(module)
        self.names = names
        self.make_piece = make_piece
        self.fake_mode = fake_mode

    def run(self, *args: Any, **kwargs: Any) -> Any:
        from torch._dispatch.python import enable_python_dispatcher

        with self.fake_mode, enable_python_dispatcher():
            return super().run(*args, **kwargs)

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        output = super().call_module(target, args, kwargs)
        if target in self.names:
            submod = self.fetch_attr(target)
            # The generated forward calls self.<target>(...); an instance attribute
            # shadows the registered submodule without unregistering it.
            self.module.__dict__[target] = self.make_piece(target, submod, list(args))
        return output


class VllmBackend:
    """Split-and-compile backend; one instance per compiled module (``prefix``)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
        is_encoder: bool = False,
        use_aot_compile: bool = True,
        splitting_ops: list[str] | None = None,
        one_range: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.splitting_ops = splitting_ops
        """Ops to split at instead of ``compilation_config.splitting_ops``."""
        self.one_range = one_range
        """Compile every piece once, for any token count (no compile ranges or sizes)."""
        self.compilation_config = vllm_config.compilation_config
        self.prefix = prefix or "model"
        self.is_encoder = is_encoder
        self.use_aot_compile = use_aot_compile
        """Whether the model's Dynamo trace may be saved with the compile cache
        (see `minivllm.compilation.aot`)."""
        self.split_gm: fx.GraphModule | None = None
        self.items: list[SplitItem] = []
        self.pieces: list[PiecewiseBackend] = []
        self.compiler: PieceCompiler | None = None
        self.piece_wrapper: Callable[[Callable[..., Any], int, int], Callable[..., Any]] | None = (
            None
        )
        """Set by the model runner on CUDA to wrap each piece for piecewise graph capture."""
        if self.use_inductor and vllm_config.device_config.device_type == "cpu":
            # Before Dynamo traces and Inductor compiles or loads anything (it waits
            # for a first start's background check, which runs Dynamo itself).
            settle_vec_isa()

    @property
    def use_inductor(self) -> bool:
        return self.compilation_config.backend == "inductor"

    def aot_directory(self) -> Path | None:
        """Where the AOT trace of this module lives: the compile cache directory, when
        AOT compilation is allowed and the cache is on (Inductor only); else None."""
        if not (self.use_aot_compile and self.use_inductor) or _cache_disabled():
            return None
        return local_cache_dir(self.vllm_config, self.prefix)

    def _make_compiler(self) -> PieceCompiler:
        compilation_config = self.compilation_config
        cache = None
        if self.use_inductor and not _cache_disabled():
            # Only the model forward's directory is the config's local_cache_dir.
            directory = local_cache_dir(
                self.vllm_config, self.prefix, record=self.splitting_ops is None
            )
            cache = CompileCache(directory, compilation_config.compile_cache_save_format)
            logger.info(
                "compile cache: %s (%s)", directory, compilation_config.compile_cache_save_format
            )
        return PieceCompiler(self.use_inductor, compilation_config.inductor_compile_config, cache)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        start = time.perf_counter()
        compilation_config = self.compilation_config
        compilation_counter.num_graphs_seen += 1
        passes = run_passes(gm, compilation_config.pass_config)
        splitting_ops = list(
            compilation_config.splitting_ops or []
            if self.splitting_ops is None
            else self.splitting_ops
        )
        self.split_gm, self.items = split_graph(gm, splitting_ops)
        to_compile = [item for item in self.items if not item.is_splitting_graph]
        compilation_counter.num_piecewise_graphs_seen += len(to_compile)
        compilation_counter.num_splitting_ops_seen += len(self.items) - len(to_compile)
        self.compiler = self._make_compiler()
        ranges = [] if self.one_range else compilation_config.get_compile_ranges()
        sizes = [] if self.one_range else [int(s) for s in compilation_config.compile_sizes or []]
        num_pieces = len(to_compile)
        records: dict[str, Any] = {}

        def make_piece(name: str, submod: fx.GraphModule, args: list[Any]) -> Callable[..., Any]:
            assert self.compiler is not None
            index = len(self.pieces)
            piece = PiecewiseBackend(submod, index, args, self.compiler, ranges, sizes)
            self.pieces.append(piece)
            records[name] = piece.record()
            if self.piece_wrapper is not None:
                return self.piece_wrapper(piece, index, num_pieces)
            return piece

        cache = self.compiler.cache
        fingerprint = _fingerprint(gm, example_inputs, splitting_ops, ranges, sizes)
        recorded = cache.recorded_pieces(fingerprint) if cache is not None else None
        if recorded is None or not self._install_recorded(to_compile, recorded, ranges, sizes):
            fake_mode = detect_fake_mode(example_inputs)
            assert fake_mode is not None, "VllmBackend runs inside a Dynamo trace"
            fake_args = [
                fake_mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                for t in example_inputs
            ]
            self.pieces = []
            compilation_counter.num_shape_runs += 1
            _PieceInstaller(
                self.split_gm, {i.submod_name for i in to_compile}, make_piece, fake_mode
            ).run(*fake_args)
            if cache is not None:
                cache.record_pieces(fingerprint, records)
        elapsed = time.perf_counter() - start
        logger.info(
            "VLLM_COMPILE (%s): %d pieces around %d splitting ops, passes %s; "
            "%.2f s compiling (backend %r)",
            self.prefix,
            num_pieces,
            len(self.items) - num_pieces,
            passes,
            elapsed,
            compilation_config.backend,
        )
        return self.split_gm

    def _install_recorded(
        self,
        to_compile: list[SplitItem],
        recorded: dict[str, Any],
        ranges: list[Any],
        sizes: list[int],
    ) -> bool:
        """Install every piece from the entries a former start recorded for this graph
        (no fake-tensor run); False, with nothing installed, if one is not cached."""
        assert self.compiler is not None and self.split_gm is not None
        pieces = []
        for item in to_compile:
            record = recorded.get(item.submod_name)
            piece = None
            if record is not None:
                piece = PiecewiseBackend.from_record(
                    getattr(self.split_gm, item.submod_name),
                    record,
                    self.compiler,
                    ranges,
                    sizes,
                )
            if piece is None:
                return False
            pieces.append(piece)
        self.pieces = sorted(pieces, key=lambda p: p.piece_index)
        for item, piece in zip(to_compile, pieces, strict=True):
            call = piece
            if self.piece_wrapper is not None:
                call = self.piece_wrapper(piece, piece.piece_index, len(pieces))
            # As `_PieceInstaller`: an instance attribute shadows the submodule.
            self.split_gm.__dict__[item.submod_name] = call
        return True


def _fingerprint(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    splitting_ops: list[str],
    ranges: list[Any],
    sizes: list[int],
) -> str:
    """A hash of what decides the split graph's pieces and their entries: the traced
    code, its inputs' dtypes and (symbolic) shapes, the splitting ops, the shapes
    compiled for, and the torch version."""
    parts = [torch.__version__, gm.code, repr(splitting_ops), repr(ranges), repr(sizes)]
    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            parts.append(f"{t.dtype}{tuple(t.shape)}{t.stride()}{t.device.type}")
        else:
            parts.append(repr(t))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _cache_disabled() -> bool:
    return envs.disable_compile_cache()


__all__ = ["VllmBackend"]


def init_backend(
    vllm_config: VllmConfig,
    prefix: str = "",
    is_encoder: bool = False,
    use_aot_compile: bool = True,
) -> str | Callable[..., Any]:
    """The torch.compile backend of ``vllm_config.compilation_config`` (vLLM's
    ``CompilationConfig.init_backend``; here, since the config layer sits below the
    compiler): a backend name or callable for modes 1 and 2, minivllm's piecewise
    `VllmBackend` for VLLM_COMPILE.  ``prefix`` names this module's cache directory;
    ``is_encoder`` marks a multimodal encoder; ``use_aot_compile`` lets VLLM_COMPILE
    save the Dynamo trace with the compile cache (`minivllm.compilation.aot`)."""
    compilation_config = vllm_config.compilation_config
    if compilation_config.mode is None:
        raise ValueError(
            "No compilation mode is set; build the config through VllmConfig, which "
            "chooses one, or set mode explicitly."
        )
    if compilation_config.mode == CompilationMode.NONE:
        raise ValueError("Compilation mode is NONE: there is no backend to initialize.")
    if compilation_config.mode in (
        CompilationMode.STOCK_TORCH_COMPILE,
        CompilationMode.DYNAMO_TRACE_ONCE,
    ):
        from torch._dynamo.backends.registry import list_backends

        if compilation_config.backend in list_backends(exclude_tags=()):
            return compilation_config.backend
        return resolve_obj_by_qualname(compilation_config.backend)
    if compilation_config.backend not in ("eager", "inductor"):
        logger.info("Using the custom backend %r for compilation.", compilation_config.backend)
    return VllmBackend(
        vllm_config, prefix=prefix, is_encoder=is_encoder, use_aot_compile=use_aot_compile
    )
