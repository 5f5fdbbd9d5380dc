"""Environment variables that minivllm reads.

They are read when asked for (not cached at import) so tests can set them
with ``monkeypatch.setenv``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def _flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def torch_compile_disable() -> bool:
    """``TORCH_COMPILE_DISABLE=1`` turns every torch.compile into eager (as in PyTorch)."""
    return _flag("TORCH_COMPILE_DISABLE")


def cache_root() -> Path:
    """Root of minivllm's on-disk caches (``MINIVLLM_CACHE_ROOT``, default ~/.cache/minivllm)."""
    raw = os.environ.get("MINIVLLM_CACHE_ROOT")
    if raw:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "minivllm"


def log_level() -> str:
    """``MINIVLLM_LOGGING_LEVEL`` (default INFO)."""
    return os.environ.get("MINIVLLM_LOGGING_LEVEL", "INFO").upper()


def compile_cache_save_format() -> str:
    """``MINIVLLM_COMPILE_CACHE_SAVE_FORMAT``: ``binary`` (default) or ``unpacked``."""
    return os.environ.get("MINIVLLM_COMPILE_CACHE_SAVE_FORMAT", "binary").strip().lower()


def use_aot_compile() -> bool:
    """``MINIVLLM_USE_AOT_COMPILE`` (default on): save VLLM_COMPILE's Dynamo trace with
    the compile cache and load it on later starts instead of tracing again."""
    return _flag("MINIVLLM_USE_AOT_COMPILE", default=True)


def cpu_fused_layers() -> bool:
    """``MINIVLLM_CPU_FUSED_LAYERS`` (default on): the CPU decode graph runs each
    eligible decoder layer as one ``minivllm_cpu::decoder_layer`` call (all of
    them as one ``decoder_stack`` call where every layer is eligible:
    `minivllm.model_executor.layers.fused_decoder_layer`); 0 traces the layers'
    own ops instead (same results up to float rounding)."""
    return _flag("MINIVLLM_CPU_FUSED_LAYERS", default=True)


def cpu_threads() -> int | None:
    """``MINIVLLM_CPU_THREADS``: torch threads for the whole engine on CPU (split over
    its ranks); None when unset (the usable cores, `minivllm.platforms.cpu`)."""
    raw = os.environ.get("MINIVLLM_CPU_THREADS", "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"MINIVLLM_CPU_THREADS must be a whole number >= 1, got {raw!r}")
    return value


def cpu_block_cache_bytes() -> int:
    """``MINIVLLM_CPU_BLOCK_CACHE_MIB`` (default 512): the most MiB of freed CPU blocks
    of 16 MiB and up that a CPU worker keeps for reuse once it is ready
    (`lowbit_cpu.install_block_cache`; a decode step of 64 rows of a 262k vocabulary
    uses about 400 MiB of such blocks); 0 leaves torch's allocator as it is."""
    raw = os.environ.get("MINIVLLM_CPU_BLOCK_CACHE_MIB", "512")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"MINIVLLM_CPU_BLOCK_CACHE_MIB must be a whole number of MiB >= 0, got {raw!r}"
        )
    return value << 20


def cpu_kernels() -> bool:
    """``MINIVLLM_CPU_KERNELS`` (default on): 0 never builds or loads minivllm's C++ CPU
    ops, so the low-bit layers fall back to torch."""
    return os.environ.get("MINIVLLM_CPU_KERNELS", "1") != "0"


def cpu_amx() -> bool:
    """``MINIVLLM_CPU_AMX`` (default on): 0 keeps minivllm's q4 GEMMs of 8 tokens or
    more on AVX-512 VNNI even where the CPU has AMX tiles."""
    return os.environ.get("MINIVLLM_CPU_AMX", "1") != "0"


def cpu_huge_pages() -> bool:
    """``MINIVLLM_CPU_HUGE_PAGES`` (default on): 0 leaves a CPU model's weights in the
    pages they were loaded into instead of moving them onto transparent huge pages
    (`minivllm.worker.weight_pages`)."""
    return os.environ.get("MINIVLLM_CPU_HUGE_PAGES", "1") != "0"


def cpu_residual_cut() -> float:
    """``MINIVLLM_CPU_RESIDUAL_CUT`` (default 0): above 0, minivllm's CPU low-bit kernels
    give an activation group its second int8 term (for what the first one's rounding
    left) only where that remainder's energy is above this share of the token's mean
    energy per group, and skip the other groups' second products
    (`minivllm.kernels.lowbit_cpu.residual_cut`).  3e-5 measured 1.1-1.14x faster
    batched decode steps for 98.3-98.5% top-1 agreement with the float32 model (100 /
    99.1% at 0); greedy tokens then depend on chunking and prefix-cache hits unless
    ``VLLM_BATCH_INVARIANT=1``."""
    raw = os.environ.get("MINIVLLM_CPU_RESIDUAL_CUT", "0")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"MINIVLLM_CPU_RESIDUAL_CUT={raw!r} is not a finite number >= 0; unset it (or "
            "use 0) for a second term in every group, or give a share such as 3e-5"
        )
    return value


def cxx_compiler() -> str | None:
    """``CXX``: the C++ compiler that builds the CPU ops (default: g++ or c++ on PATH)."""
    return os.environ.get("CXX") or None


def cpu_decode_graph() -> bool:
    """``MINIVLLM_CPU_DECODE_GRAPH`` (default on): 0 runs CPU decode steps through the
    ordinary forward instead of the one-graph decode step."""
    return os.environ.get("MINIVLLM_CPU_DECODE_GRAPH", "1") != "0"


def cpu_packed_gemm() -> bool:
    """``MINIVLLM_CPU_PACKED_GEMM`` (default on): 0 leaves linear weights unpacked
    instead of packing them for oneDNN."""
    return os.environ.get("MINIVLLM_CPU_PACKED_GEMM", "1") != "0"


def disable_compile_cache() -> bool:
    """``MINIVLLM_DISABLE_COMPILE_CACHE``: 1 compiles every start afresh."""
    return os.environ.get("MINIVLLM_DISABLE_COMPILE_CACHE", "").strip().lower() in ("1", "true")


def malloc_tuned_by_user() -> bool:
    """Whether ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` is set (the
    user's glibc tuning then wins over the worker's)."""
    return any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))


def inductor_deterministic() -> bool:
    """``TORCHINDUCTOR_DETERMINISTIC=1``: Inductor's own switch, read before Inductor
    is imported."""
    return os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1"


def ray_address() -> str | None:
    """``RAY_ADDRESS``: the Ray cluster the "ray" executor joins (None: start one)."""
    return os.environ.get("RAY_ADDRESS") or None


def ray_worker_env() -> dict[str, str]:
    """The variables a Ray actor needs from this process: the import path and the
    cache root (actors start from the cluster's environment, not ours)."""
    return {k: os.environ[k] for k in ("PYTHONPATH", "MINIVLLM_CACHE_ROOT") if k in os.environ}


def allow_runtime_lora_updating() -> bool:
    """``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (vLLM's name; default off): the server's
    ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` routes."""
    return _flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING")


def node_authkey() -> bytes:
    """``MINIVLLM_NODE_AUTHKEY``: the handshake key the nodes of a multi-node "mp" run
    share (set the same secret on every node; the default only keeps strays out)."""
    return os.environ.get("MINIVLLM_NODE_AUTHKEY", "minivllm-nodes").encode()


def openai_api_key() -> str | None:
    """``OPENAI_API_KEY``: the bearer token ``minivllm bench serve`` sends by default."""
    return os.environ.get("OPENAI_API_KEY")


def kv_events_use_int_block_hashes() -> bool:
    """``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (vLLM's name, default on): KV cache events
    carry each block hash as the unsigned integer of its last 8 bytes; 0 sends the whole
    32-byte digest."""
    return _flag("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", default=True)


def set_default_omp_spin() -> None:
    """Give libgomp a short spin (``GOMP_SPINCOUNT=1000``) unless the user chose one
    (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``); it must run before torch loads libgomp."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "1000"


_DERIVED_INDUCTOR_DIR = "MINIVLLM_DERIVED_INDUCTOR_CACHE_DIR"
"""Set beside ``TORCHINDUCTOR_CACHE_DIR`` when minivllm chose it, so that a child
process with another cache root derives its own instead of taking it for the user's."""


def set_default_inductor_cache_dir() -> None:
    """Keep Inductor's compiled kernels under minivllm's cache root
    (``<MINIVLLM_CACHE_ROOT>/torchinductor``) unless the user set
    ``TORCHINDUCTOR_CACHE_DIR``.  Inductor's own default is under /tmp: minivllm's saved
    compile artifacts name kernels kept there, so once /tmp was emptied (a reboot, a
    fresh container) a warm start compiled them all again (Gemma 3 270M: 29.8 s instead
    of 14.3 s on a 2-core machine).  Inductor reads the variable when it first compiles
    or loads, so this runs at import."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or current == os.environ.get(_DERIVED_INDUCTOR_DIR):
        derived = os.path.abspath(cache_root() / "torchinductor")  # Inductor's own form
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[_DERIVED_INDUCTOR_DIR] = derived


def batch_invariant() -> bool:
    """``VLLM_BATCH_INVARIANT`` (vLLM's name, default off): 1 makes a request's
    results independent of the batch it runs in (other requests, chunked prefill,
    recomputation after preemption): every low-bit linear runs the row-independent
    kernel at any row count, attention computes each query row alone over its own
    keys, and the CPU decode graph (its fused layers round differently from the
    prefill path) is off (`minivllm.model_executor.layers.batch_invariant`)."""
    return _flag("VLLM_BATCH_INVARIANT")
