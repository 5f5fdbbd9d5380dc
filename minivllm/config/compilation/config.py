"""`CompilationConfig`: how the model is compiled and which CUDA graphs are captured.

This is the public module of the compilation configuration: every enum, sub-config
and grid function of it is importable from here.

A `CompilationConfig` on its own is only half resolved: fields left ``None``
(``mode``, ``cudagraph_mode``, capture sizes, ...) are filled in by
`VllmConfig.__post_init__`, which also calls the resolution methods below.

Why CUDA graphs and Inductor use different size lists: a captured CUDA graph replays
only at the exact size it was captured at, so every size to be replayed must be
captured; an Inductor graph compiled for a symbolic size serves all sizes, and
compiling for a specific size (``compile_sizes``) is only an extra optimisation.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter, field_validator

from minivllm import envs
from minivllm.config.compilation import checks as _checks
from minivllm.config.compilation import cudagraph as _cg
from minivllm.config.compilation.checks import (
    BASE_CUSTOM_OPS,
    COMPILE_SIZES_FROM_CAPTURE,
    PIECEWISE_BACKENDS,
)
from minivllm.config.compilation.dynamic_shapes import DynamicShapesConfig
from minivllm.config.compilation.legacy import migrate_legacy_fields
from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode, log_once
from minivllm.config.compilation.pass_config import PassConfig
from minivllm.config.compilation.splitting_ops import names_op, normalize_splitting_ops
from minivllm.config.utils import config, get_hash_factors, hash_factors
from minivllm.logger import init_logger
from minivllm.platforms import current_platform

if TYPE_CHECKING:
    pass

logger = init_logger(__name__)


@dataclasses.dataclass(frozen=True)
class Range:
    """An inclusive range of token counts ``[start, end]`` that one compiled graph serves."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start > self.end:
            raise ValueError(f"Range start {self.start} is above its end {self.end}")

    def is_single_size(self) -> bool:
        """Whether the range holds exactly one size (a graph specialised to it)."""
        return self.start == self.end

    def __contains__(self, size: object) -> bool:
        return isinstance(size, int) and self.start <= size <= self.end

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"


@config
class CompilationConfig:
    """How the model is compiled (torch.compile, custom passes) and captured (CUDA graphs).

    Pass it to `VllmConfig`, whose post-init resolves the fields left unset; used on
    its own some fields stay unresolved. Its three groups of fields: compilation
    control (mode, backend, custom_ops, splitting_ops, caches), CUDA graph capture
    (cudagraph_mode and the capture sizes) and Inductor (compile_sizes, compile ranges,
    inductor_compile_config, inductor_passes, and the passes of `pass_config`).
    """

    # -- compilation control ------------------------------------------------------
    mode: CompilationMode | None = None
    """The torch.compile pipeline: 0 NONE (eager), 1 STOCK_TORCH_COMPILE, 2
    DYNAMO_TRACE_ONCE, 3 VLLM_COMPILE; a number or a name. None: chosen by VllmConfig
    (VLLM_COMPILE above optimization level O0, NONE at O0)."""
    debug_dump_path: Path | None = None
    """Directory to write compilation debug output (graphs, passes) to; None writes nothing."""
    cache_dir: str = ""
    """Directory of the compiled-graph cache; empty derives one from the model and config."""
    compile_cache_save_format: Literal["binary", "unpacked"] = field(
        default_factory=envs.compile_cache_save_format
    )
    """How the compile cache is written: "binary" (one file, safe with several processes)
    or "unpacked" (a directory tree to inspect; not multiprocess safe). Default:
    $MINIVLLM_COMPILE_CACHE_SAVE_FORMAT, else "binary"."""
    backend: str = ""
    """torch.compile backend: empty picks the platform's ("inductor"); a backend name
    registered with PyTorch ("eager", "inductor", ...); or a dotted path to a backend
    callable. A string, so the config pickles across processes. Modes 1 and 2 hand it
    the whole graph; VLLM_COMPILE accepts only "eager" or "inductor" and compiles the
    pieces between splitting ops with it."""
    custom_ops: list[str] = field(default_factory=list)
    """Which custom ops (hand-written kernels) run instead of their plain-PyTorch version:
    one base of "all" or "none", then "+name" to enable or "-name" to disable one op,
    e.g. ["none", "+rms_norm"]. Without a base, ops are on without Inductor and off with
    it (Inductor generates fused kernels for the plain version)."""
    ir_enable_torch_wrap: bool | None = None
    """Wrap IR ops as torch custom ops during the forward pass. Off lets Dynamo trace the
    chosen implementation directly and skips the wrapper's overhead in eager mode.
    None: on for VLLM_COMPILE with Inductor, off otherwise (set by VllmConfig)."""
    splitting_ops: list[str] | None = None
    """Ops kept out of CUDA graphs: "namespace::name" (every overload) or
    "namespace::name.overload" (that one only); vLLM's attention op names, such as
    "vllm::unified_attention_with_output", mean minivllm's. Without Inductor graph partition
    the FX graph is split at them before compilation; with it, Inductor partitions at
    them after its passes. None: the attention ops (plus the KV-cache update ops);
    []: nothing is split out (for full graphs)."""
    compile_mm_encoder: bool = False
    """Also compile the multimodal encoder (off until more encoders are known to work)."""

    # -- multimodal encoder CUDA graphs -----------------------------------------
    cudagraph_mm_encoder: bool = False
    """Capture the whole multimodal (vision) encoder forward as CUDA graphs, one per
    token budget in encoder_cudagraph_token_budgets."""
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)
    """Token capacities of the encoder graphs; images are packed into the smallest that
    fits. Empty: powers of two between the model's smallest and largest budget."""
    encoder_cudagraph_max_vision_items_per_batch: int = 0
    """Images/videos per captured encoder batch; 0 infers max_budget // min_budget."""
    encoder_cudagraph_max_frames_per_batch: int | None = None
    """Video frames per captured encoder batch (sizes the cu_seqlens buffer). None infers
    items per batch * frames per video; 0 captures images only."""

    # -- decoder replay (YOCO models) ------------------------------------------
    cudagraph_decoder_replay: bool = True
    """Give the decoder replay layers of YOCO models their own CUDA graphs and trim them
    in PIECEWISE steps. Needs breakable PIECEWISE graphs; ignored under LoRA, prompt
    embeddings and on pipeline ranks other than the first."""
    decoder_replay_cudagraph_capture_sizes: list[int] = field(default_factory=list)
    """Sizes of the decoder replay graphs (each positive, at most max_num_batched_tokens).
    Empty: multiples of the sliding window up to min(max_cudagraph_capture_size,
    max_num_seqs * sliding_window), coarser past 16 windows; larger batches run eagerly."""
    decoder_replay_trim_threshold: int = Field(default=768, ge=0)
    """PIECEWISE graphs padded to at least this many tokens trim the decoder replay batch.
    Must exceed the replay window (128) to have any effect. Eager steps always trim."""

    # -- Inductor ---------------------------------------------------------------
    compile_sizes: list[int | str] | None = None
    """Sizes Inductor also compiles a static-shape graph for; the string
    "cudagraph_capture_sizes" stands for all CUDA graph capture sizes."""
    compile_ranges_endpoints: list[int] | None = None
    """Split points of the token-count ranges compiled separately: [1, e0], [e0+1, e1],
    ..., [e_last+1, max_num_batched_tokens]. A compile size inside a range wins over it."""
    inductor_compile_config: dict = field(default_factory=dict)
    """Extra options passed to Inductor (its config keys)."""
    inductor_passes: dict[str, str | Callable[..., Any]] = field(default_factory=dict)
    """Extra Inductor passes: name -> dotted path of the pass function (a string keeps
    the config JSON-able); from Python the callable itself may be given."""

    # -- CUDA graphs ------------------------------------------------------------
    cudagraph_mode: CUDAGraphMode | None = None
    """Which batches replay CUDA graphs: NONE; PIECEWISE (pieces between splitting ops);
    FULL (whole forward, every batch); FULL_DECODE_ONLY (full graphs for decode, mixed
    batches eager); FULL_AND_PIECEWISE (full for decode, piecewise for the rest; the
    default above O0). Case-insensitive names are accepted. Piecewise graphs need
    VLLM_COMPILE and splitting ops; full graphs work with or without compilation."""
    use_breakable_cudagraph: bool | None = None
    """Break CUDA graphs at capture time (stream-capture breaks) instead of splitting the
    FX graph. None: unresolved; VllmConfig decides from the environment and model."""
    cudagraph_num_of_warmups: int = 0
    """Eager runs of each size before its graph is captured."""
    cudagraph_capture_sizes: list[int] | None = None
    """Token counts to capture graphs at. None: derived by VllmConfig. After resolution
    it lists every captured size, ascending."""
    prefill_cudagraph_capture_token_sizes: list[int] | None = None
    """Token counts of the graphs for non-uniform batches (with a prefill or mixed query
    lengths), and of every graph under FULL or PIECEWISE. [] captures none; sizes above
    max_num_batched_tokens are dropped. None: the prefill grid up to
    max_prefill_cudagraph_capture_tokens."""
    max_prefill_cudagraph_capture_tokens: int | None = Field(default=None, ge=0)
    """Largest prefill graph in tokens. None: 8192 on SM100, else the platform's default
    max capture size; never above max_num_batched_tokens."""
    decode_cudagraph_capture_request_sizes: list[int] | None = None
    """Request counts of the FULL graphs for uniform decode batches (all requests with
    the same query length q; n requests are n * q tokens). [] captures none. None: the
    decode grid up to max_decode_cudagraph_capture_requests. Under adaptive verification
    the target model uses token-keyed graphs instead and these set the drafter's."""
    max_decode_cudagraph_capture_requests: int | None = Field(default=None, ge=0)
    """Largest decode graph in requests (also bounds adaptive verification's token
    graphs). None: max_num_seqs on SM100, else what the default max capture size holds."""
    max_decode_cudagraph_capture_tokens: int | None = Field(default=None, ge=1)
    """Token budget of one uniform decode graph (n requests of q tokens are captured only
    while n * q fits; wider batches use the prefill graphs). None: 8192 on SM100, else
    no budget."""
    cudagraph_copy_inputs: bool = False
    """Copy inputs into graph-owned buffers before replay; needed only when callers do not
    reuse the same input buffers. Applies to PIECEWISE graphs."""
    cudagraph_specialize_lora: bool = True
    """Capture separate graphs for batches with and without active LoRA adapters, so
    batches without adapters skip the LoRA ops (more startup time and memory)."""
    use_inductor_graph_partition: bool | None = None
    """Let Inductor partition the graph at cudagraph-unsafe ops after all passes, instead
    of splitting the FX graph first: passes see the whole graph, and one compilation
    serves both piecewise and full graphs. None: set by the optimization level."""

    pass_config: PassConfig = field(default_factory=PassConfig)
    """Switches of the custom graph passes (see PassConfig); a dict is accepted."""
    max_cudagraph_capture_size: int | None = None
    """Largest capture size in tokens. With cudagraph_capture_sizes given it is their max;
    otherwise sizes [1, 2, 4] + every 8 below 256 + every 16 up to it are generated.
    None: 512 (1024 on data-center Blackwell), capped by max_num_batched_tokens."""
    dynamic_shapes_config: DynamicShapesConfig = field(default_factory=DynamicShapesConfig)
    """How torch.compile treats the dynamic token dimension."""
    local_cache_dir: str | None = field(default=None, init=False)
    """This rank's compile cache directory (set at compile time)."""
    fast_moe_cold_start: bool | None = None
    """Faster MoE start-up that assumes the forward pass runs only this model and its
    MoE layers in construction order (silently wrong otherwise, e.g. with a drafter
    that has MoE layers). None: on, except with speculative decoding."""

    # -- runtime state (not user input) -----------------------------------------
    enabled_custom_ops: Counter[str] = field(default_factory=Counter, init=False)
    """Custom ops instantiated enabled, counted while the model is built."""
    disabled_custom_ops: Counter[str] = field(default_factory=Counter, init=False)
    """Custom ops instantiated disabled, counted while the model is built."""
    traced_files: set[str] = field(default_factory=set, init=False)
    """Source files Dynamo traced (part of the compile-cache key)."""
    compilation_time: float = field(default=0.0, init=False)
    """Seconds spent compiling the model."""
    encoder_compilation_time: float = field(default=0.0, init=False)
    """Seconds spent compiling the multimodal encoder."""
    static_forward_context: dict[str, Any] = field(default_factory=dict, init=False)
    """Layer name -> layer object, for layers the runtime reaches outside model code."""
    static_all_moe_layers: list[str] = field(default_factory=list, init=False)
    """Names of every MoE layer of the model."""

    # -- deprecated spellings (see compilation_legacy.py) -------------------------
    level: int | str | None = None
    """Deprecated: use mode (same numbers). Translated in post-init, then reset to None."""
    use_inductor: bool | None = None
    """Deprecated: use backend ("inductor" for True, "eager" for False)."""
    use_cudagraph: bool | None = None
    """Deprecated: False means cudagraph_mode=NONE."""
    full_cuda_graph: bool | None = None
    """Deprecated: True means cudagraph_mode=FULL."""

    _attention_ops: ClassVar[tuple[str, ...]] = _cg.ATTENTION_OPS
    _kv_cache_update_ops: ClassVar[tuple[str, ...]] = _cg.KV_CACHE_UPDATE_OPS

    # -- parsing ------------------------------------------------------------------
    @field_validator("mode", mode="before")
    @classmethod
    def validate_mode_before(cls, value: Any) -> Any:
        """Accept a mode as a name (any case) or a number 0-3."""
        valid = ", ".join(f"{m.name} ({m.value})" for m in CompilationMode)
        if isinstance(value, str):
            name = value.strip().upper()
            if name.isdigit():
                value = int(name)
            elif name in CompilationMode.__members__:
                return CompilationMode[name]
            else:
                raise ValueError(f"Invalid compilation mode {value!r}. Valid modes are: {valid}")
        if isinstance(value, int) and not isinstance(value, bool):
            if value not in {m.value for m in CompilationMode}:
                raise ValueError(f"Invalid compilation mode {value}. Valid modes are: {valid}")
            return CompilationMode(value)
        return value

    @field_validator("cudagraph_mode", mode="before")
    @classmethod
    def validate_cudagraph_mode_before(cls, value: Any) -> Any:
        """Accept a CUDA graph mode by name, in any case."""
        if isinstance(value, str):
            name = value.strip().upper()
            if name not in CUDAGraphMode.__members__:
                raise ValueError(
                    f"Invalid cudagraph_mode {value!r}. Valid modes are: "
                    f"{', '.join(CUDAGraphMode.__members__)}"
                )
            return CUDAGraphMode[name]
        return value

    @field_validator("splitting_ops", mode="before")
    @classmethod
    def validate_splitting_ops_before(cls, value: Any) -> Any:
        """Check op names; vLLM's attention op names become minivllm's (see
        `minivllm.config.compilation.splitting_ops`)."""
        if isinstance(value, list):
            return normalize_splitting_ops(value)
        return value

    @field_validator("pass_config", mode="before")
    @classmethod
    def validate_pass_config_before(cls, value: Any) -> Any:
        """Accept the pass config as a dict of its fields."""
        if isinstance(value, dict):
            return PassConfig(**value)
        return value

    @field_validator("compile_cache_save_format", mode="before")
    @classmethod
    def validate_compile_cache_save_format(cls, value: Any) -> Any:
        """Only "binary" and "unpacked" exist."""
        if value not in ("binary", "unpacked"):
            raise ValueError(
                f"compile_cache_save_format must be 'binary' or 'unpacked', got {value!r}"
            )
        return value

    # -- post-init ----------------------------------------------------------------
    def __post_init__(self) -> None:
        # Order matters: old spellings first (they set mode/backend/cudagraph_mode), the
        # backend rule before the platform's default backend fills an empty one.
        migrate_legacy_fields(self)
        _checks.check_compile_cache_save_format(self)
        _checks.default_inductor_options(self)
        _checks.resolve_inductor_passes(self)
        _checks.enable_rope_op_for_rope_fusions(self)
        if self.use_inductor_graph_partition and not _checks.torch_at_least("2.9.0.dev"):
            raise ValueError(
                "use_inductor_graph_partition needs torch>=2.9; set "
                "use_inductor_graph_partition=False."
            )
        _checks.validate_custom_ops(self.custom_ops)
        _checks.validate_sizes(self)
        if self.mode == CompilationMode.VLLM_COMPILE and self.backend not in PIECEWISE_BACKENDS:
            raise ValueError(
                f"Invalid backend for piecewise compilation: {self.backend!r}. VLLM_COMPILE "
                "supports 'eager' and 'inductor'; use mode STOCK_TORCH_COMPILE (1) or "
                "DYNAMO_TRACE_ONCE (2) for another backend."
            )
        if self.backend == "":
            self.backend = current_platform.get_compile_backend()

    # -- hashing and printing -------------------------------------------------------
    def compute_hash(self) -> str:
        """Hash of everything that shapes the compiled graph from input ids/embeddings to
        the final hidden states; paths, timings and runtime bookkeeping are left out."""
        ignored_factors = {
            "debug_dump_path",
            "cache_dir",
            "local_cache_dir",
            "traced_files",
            "compilation_time",
            "encoder_compilation_time",
            "enabled_custom_ops",
            "disabled_custom_ops",
            "static_forward_context",
            "pass_config",  # hashed by its own compute_hash below
            "dynamic_shapes_config",  # likewise
        }
        factors = get_hash_factors(self, ignored_factors)
        factors["pass_config"] = self.pass_config.compute_hash()
        factors["dynamic_shapes_config"] = self.dynamic_shapes_config.compute_hash()
        return hash_factors(factors)

    def __repr__(self) -> str:
        """Only the fields that differ from a default-constructed config."""
        values = _ADAPTER.dump_python(self, exclude=_REPR_EXCLUDE)
        defaults = _ADAPTER.dump_python(CompilationConfig(), exclude=_REPR_EXCLUDE)
        shown: dict[str, Any] = {}
        for name, value in values.items():
            default = defaults.get(name)
            if isinstance(value, dict) and name == "pass_config":
                value = {k: v for k, v in value.items() if v != default.get(k)}
                if value:
                    shown[name] = value
            elif value != default:
                shown[name] = _readable(value)
        return str(shown)

    __str__ = __repr__

    # -- methods used by VllmConfig and the compilation backend ---------------------
    def post_init_cudagraph_sizes(self) -> None:
        """Finish the sizes once the capture sizes are known: expand `compile_sizes`
        (de-duplicated, ascending) and sort `cudagraph_capture_sizes`."""
        capture_sizes = self.cudagraph_capture_sizes or []
        computed: set[int] = set()
        for size in self.compile_sizes or []:
            if isinstance(size, str):
                assert size == COMPILE_SIZES_FROM_CAPTURE, f"unchecked compile size {size!r}"
                computed.update(capture_sizes)
            else:
                computed.add(size)
        self.compile_sizes = sorted(computed)  # type: ignore[assignment]
        if self.cudagraph_capture_sizes is not None:
            self.cudagraph_capture_sizes.sort()
            if self.cudagraph_capture_sizes:
                assert self.cudagraph_capture_sizes[-1] == self.max_cudagraph_capture_size, (
                    "max_cudagraph_capture_size must be the largest capture size"
                )

    def set_splitting_ops_for_v1(self, all2all_backend: str, data_parallel_size: int = 1) -> None:
        """Settle `splitting_ops` and the modes that depend on them (see
        compilation_cudagraph.set_splitting_ops_for_v1)."""
        _cg.set_splitting_ops_for_v1(self, all2all_backend, data_parallel_size)

    def set_splitting_ops_for_attn_fusion(self) -> None:
        """With attention + quant fusion, keep attention inside the graph."""
        _cg.set_splitting_ops_for_attn_fusion(self)

    def splitting_ops_contain_attention(self) -> bool:
        """Whether every attention op is a splitting op."""
        return self.splitting_ops is not None and all(
            names_op(self.splitting_ops, op) for op in self._attention_ops
        )

    def splitting_ops_contain_kv_cache_update(self) -> bool:
        """Whether the KV-cache update ops are (or, once splitting ops are settled, will
        be) splitting ops."""
        if (
            not self.use_inductor_graph_partition
            and self.splitting_ops is None
            and not self.pass_config.fuse_attn_quant
        ):
            # set_splitting_ops_for_v1 will add them to the default splitting ops.
            return True
        return self.splitting_ops is not None and all(
            names_op(self.splitting_ops, op) for op in self._kv_cache_update_ops
        )

    def is_attention_compiled_piecewise(self) -> bool:
        """Whether attention runs outside the compiled (and captured) pieces."""
        if not self.splitting_ops_contain_attention():
            return False
        if not self.use_inductor_graph_partition:
            return self.mode == CompilationMode.VLLM_COMPILE
        return self.backend == "inductor" and self.mode != CompilationMode.NONE

    def custom_op_log_check(self, op_registry: Collection[str] | None = None) -> None:
        """Log the custom ops the model enabled/disabled, and warn about entries of
        `custom_ops` that name no op of the model. ``op_registry`` (all registered op
        names; the model runner passes them after building the model) tells a missing
        op from one this model does not use."""
        if len(self.enabled_custom_ops) + len(self.disabled_custom_ops) == 0:
            logger.debug("No custom ops found in model.")
            return
        logger.debug("enabled custom ops: %s", self.enabled_custom_ops)
        logger.debug("disabled custom ops: %s", self.disabled_custom_ops)
        if op_registry is None:
            op_registry = ()
        in_model = self.enabled_custom_ops | self.disabled_custom_ops
        for op in self.custom_ops:
            if op in BASE_CUSTOM_OPS:
                continue
            assert op[0] in "+-", "custom_ops syntax is checked in post-init"
            name = op[1:]
            if name in in_model:
                continue
            missing = (
                "not present in model"
                if name in op_registry
                else "doesn't exist (or wasn't imported/registered)"
            )
            action = "enabling" if op[0] == "+" else "disabling"
            log_once(
                logger, logging.WARNING, "Op '%s' %s, %s with '%s' has no effect",
                name, missing, action, op,
            )  # fmt: skip

    def is_custom_op_enabled(self, op: str) -> bool:
        """Whether custom op ``op`` is enabled; needs exactly one base mode in custom_ops."""
        count_all = self.custom_ops.count("all")
        count_none = self.custom_ops.count("none")
        if count_all + count_none != 1:
            raise ValueError("custom_ops must contain exactly one base mode: 'all' or 'none'")
        if count_all:
            return f"-{op}" not in self.custom_ops
        return f"+{op}" in self.custom_ops

    # The module function takes the config first, so it serves as the method as is
    # (kept in compilation_cudagraph to keep this file short).
    resolve_cudagraph_mode_and_sizes = _cg.resolve_cudagraph_mode_and_sizes

    def adjust_cudagraph_sizes_for_spec_decode(self, uniform_decode_query_len: int) -> None:
        """Round the capture sizes up to whole requests of ``uniform_decode_query_len``."""
        _cg.adjust_cudagraph_sizes_for_spec_decode(self, uniform_decode_query_len)

    def get_compile_ranges(self) -> list[Range]:
        """The token ranges compiled separately: [1, e0], [e0+1, e1], ... over the sorted,
        de-duplicated endpoints; empty when no endpoints are set."""
        if self.compile_ranges_endpoints is None:
            return []
        endpoints = sorted(set(self.compile_ranges_endpoints))
        return [Range(s + 1, e) for s, e in zip([0, *endpoints[:-1]], endpoints, strict=False)]


def _readable(value: Any) -> Any:
    # Enums print by name and paths as text, so the repr reads like the user's input.
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, PurePath):
        return str(value)
    return value


_ADAPTER: TypeAdapter[CompilationConfig] = TypeAdapter(CompilationConfig)
_REPR_EXCLUDE: dict[str, Any] = {
    "static_forward_context": True,
    "enabled_custom_ops": True,
    "disabled_custom_ops": True,
    "compilation_time": True,
    "encoder_compilation_time": True,
    "traced_files": True,
    "inductor_compile_config": {"post_grad_custom_post_pass": True},
}

__all__ = ["CompilationConfig", "Range"]
