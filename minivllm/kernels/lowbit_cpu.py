"""Building and loading minivllm's C++ CPU kernels: the ``minivllm_cpu`` torch ops.

The sources (``lowbit_cpu.cpp``: low-bit GEMMs; ``decode_attention_cpu.cpp``: the
decode graph's paged attention; ``decode_layer_cpu.cpp``: its fused decoder
layer; ``block_cache_cpu.cpp``: the CPU block cache; ``encoder_attention_cpu.cpp``:
encoder-only attention; ``logits_cpu.cpp``: top-k candidates, greedy tokens and
temperature draws over the logits; ``gguf_rows_cpu.cpp``: rows of raw GGUF tables
as float32; the GEMM and attention kernels and the thread team in the headers) are
compiled into one library
once per machine, torch version and source text with the system C++ compiler
(the one torch.compile's CPU backend already needs) into
``<cache root>/kernels``, then loaded with ``torch.ops.load_library``; later
processes load the cached library in milliseconds.  `start_building` runs the
first build in the background while the rest of a start-up goes on.  No compiler,
or a failed
build, leaves `available` false: the low-bit layers then use torch's own int4 /
int8 kernels (slower at one token, same results up to rounding), with one
warning saying why.  ``MINIVLLM_CPU_KERNELS=0`` turns the kernels off.

Ops (all CPU, float32 out):

- ``q4_gemm(x, qweight, scales)``: ``x [M, K] @ W.T`` for int4 weights in the
  tiled layout `pack_q4` makes;
- ``q8_gemm(x, qweight, row_scale, amx=True)``: the same for row-major int8 weights
  with one scale per output row (or Q8_0's per 32 inputs); from 3 rows on AMX tiles
  where the CPU has them, unless ``amx`` is false (a row's result then does not
  depend on how many rows the call has);
- ``q4_dequantize(qweight, scales, K, dtype, row0=0, rows=-1)``: the dense weight of
  a tiled one, or its rows ``[row0, row0 + rows)`` (whole 16-row tiles);
- ``int8_mm_scale(acc, hi, lo, scale)``: the float32 rows of an int8 x int8 product
  made for two activation terms (`quantized_linear.int8_act_mm`), in one pass;
- ``top_logit_indices(logits, k)``, ``greedy_tokens(logits, invalid, none)`` and
  ``sample_rows(logits, rows, temperature, u, invalid, none)``: the LM head
  refinement's candidates, the sampler's greedy tokens and its draws at a
  temperature alone (run eagerly, outside compiled graphs);
- ``gguf_rows(table, ids, qtype, dim)``: rows ``ids`` of a raw GGUF table ``uint8
  [rows, row_bytes]`` of ggml type ``qtype`` as float32 ``[ids.numel(), dim]``, the
  values of ``gguf.quants.dequantize`` (`gguf_blocks.gather_rows`);
- ``lowbit_isa(force)``: the code path in use (0 portable C++, 1 AVX2,
  2 AVX-512 VNNI); ``force >= 0`` picks a lower one (tests); ``lowbit_amx(force)``:
  whether q4 GEMMs of 8 tokens or more run on AMX tiles (CPUs that have them);
  ``lowbit_prefetch(bytes)``: how far ahead the q4 and tiled q8 kernels prefetch
  their weights in one-token products (0: none; `prefetch`);
- ``decode_attention(query, key, value, cache, block_table, seq_lens, slots,
  scale, window)``: writes one decode step's K/V into the paged ``cache`` in
  place and returns the step's attention (`minivllm.attention.decode_graph`);
- ``decoder_layer(hidden, residual, norms, weights, kinds, biases, cos_sin,
  positions, cache, ..., form, lora_mask, lora_slices, lora)``: one decoder layer
  of a decode step, of the family its ``form`` bits describe (Llama, Qwen2, Qwen3,
  Gemma 3; with each row's LoRA delta where ``lora`` holds adapter slots), and
  ``decoder_stack(...)`` all of a model's in one call
  (`minivllm.model_executor.layers.fused_decoder_layer`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from minivllm import envs
from minivllm.envs import cache_root
from minivllm.logger import init_logger

logger = init_logger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in (
        "lowbit_cpu.cpp",
        "decode_attention_cpu.cpp",
        "decode_layer_cpu.cpp",
        "block_cache_cpu.cpp",
        "encoder_attention_cpu.cpp",
        "logits_cpu.cpp",
        "gguf_rows_cpu.cpp",
    )
)
HEADERS = tuple(
    Path(__file__).with_name(n)
    for n in (
        "lowbit_kernels.h",
        "q4_scales.h",
        "q4_weight.h",
        "q8_kernels.h",
        "amx_kernels.h",
        "attention_kernels.h",
        "thread_team.h",
    )
)
ROW_TILE = 16
"""Output rows per q4 tile (the kernels' register width in int32 lanes)."""
Q4_GROUP = 32
Q8_GROUP = 64
"""Inputs per activation scale of ``q8_gemm`` (its weights' input count must divide)."""

_lock = threading.Lock()
_state: dict[str, object] = {}


def _compile_flags() -> list[str]:
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = [
        "-O3",
        "-fno-math-errno",
        # No multiply-add the source does not write: GCC fuses `a * b + c` where the
        # target has FMA, differently in each template instance, which gave one
        # token other bits in a 4-token q8 tile than alone (batch invariance).
        "-ffp-contract=off",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
    ]
    flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    flags += [f"-I{sysconfig.get_paths()['include']}"]
    lib = cpp_extension.library_paths()[0]
    flags += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"]
    return flags


def _library_path() -> Path:
    text = b"".join(src.read_bytes() for src in SOURCES + HEADERS)
    text += " ".join(_compile_flags()).encode()
    key = hashlib.sha256(text + torch.__version__.encode() + sys.version.encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"lowbit_cpu-{key}.so"


def _build(target: Path) -> None:
    """Compile the sources as one translation unit, then link it into ``target``.

    Most of a source's compile time is torch's headers (5.4 s of the 6.5-9.5 s each
    takes on a 2-core EPYC), so one unit that includes every source parses them
    once: 11 s on one core, against 16.4 s wall with both cores busy for one compiler
    process per source.  The other core is left to the rest of
    the start-up (`start_building`)."""
    compiler = envs.cxx_compiler() or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = _compile_flags()
    link_flags = [f for f in flags if f.startswith(("-L", "-Wl,", "-l"))]
    compile_flags = [f for f in flags if f not in link_flags and f != "-shared"]
    logger.info("Building minivllm's CPU low-bit kernels (once per machine)...")
    # Build beside the target and rename: concurrent processes never load a half file.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        unit = Path(tmp) / "minivllm_cpu_kernels.cpp"
        unit.write_text("".join(f'#include "{src}"\n' for src in SOURCES))
        obj = Path(tmp) / "minivllm_cpu_kernels.o"
        done = subprocess.run(
            [compiler, "-c", str(unit), "-o", str(obj), *compile_flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"compiling minivllm's CPU kernels failed:\n{done.stderr[-2000:]}")
        library = Path(tmp) / target.name
        cmd = [compiler, "-shared", "-fopenmp", str(obj), "-o", str(library)]
        done = subprocess.run([*cmd, *link_flags], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"linking minivllm's CPU kernels failed:\n{done.stderr[-2000:]}")
        os.replace(library, target)


def _register_fakes() -> None:
    def q4_fake(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], q4_outputs(x.shape[1], scales), dtype=torch.float32)

    def q8_fake(
        x: torch.Tensor, qweight: torch.Tensor, row_scale: torch.Tensor, amx: bool = True
    ) -> torch.Tensor:
        return x.new_empty(x.shape[0], qweight.shape[0], dtype=torch.float32)

    def scale_fake(
        acc: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        return acc.new_empty(acc.shape[0] // 2, acc.shape[1], dtype=torch.float32)

    def attention_fake(query: torch.Tensor, *args: object) -> torch.Tensor:
        return torch.empty_like(query)

    def layer_fake(hidden: torch.Tensor, *args: object) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(hidden), torch.empty_like(hidden)

    torch.library.register_fake("minivllm_cpu::q4_gemm", q4_fake)
    torch.library.register_fake("minivllm_cpu::q8_gemm", q8_fake)
    torch.library.register_fake(
        "minivllm_cpu::q8_gemm_coarse",
        lambda x, qweight, row_scale: x.new_empty(x.shape[0], qweight.shape[0]),
    )
    torch.library.register_fake(
        "minivllm_cpu::q8_tiled_gemm",
        lambda x, tiles, row_scale, terms: x.new_empty(x.shape[0], tiles.shape[0] * ROW_TILE),
    )
    torch.library.register_fake("minivllm_cpu::int8_mm_scale", scale_fake)
    torch.library.register_fake("minivllm_cpu::decode_attention", attention_fake)
    torch.library.register_fake("minivllm_cpu::decoder_layer", layer_fake)
    torch.library.register_fake("minivllm_cpu::decoder_stack", layer_fake)
    torch.library.register_fake("minivllm_cpu::decoder_stack_bound", layer_fake)
    torch.library.register_fake(
        "minivllm_cpu::gguf_rows",
        lambda table, ids, qtype, dim: table.new_empty(ids.numel(), dim, dtype=torch.float32),
    )


def start_building() -> None:
    """Begin building the library in the background if this machine has none yet.

    Called as a start-up begins (before the config, tokenizer and weights are read),
    so the compiler runs while Python does that work; `available` then waits for the
    build instead of starting it.  A build error is reported by `available` as usual."""
    if not envs.cpu_kernels() or "ok" in _state:
        return
    with _lock:
        if "build" in _state or "ok" in _state:
            return
        path = _library_path()
        if path.exists():
            return

        def build() -> None:
            try:
                _build(path)
            except Exception as exc:  # noqa: BLE001 - re-raised by `available`
                _state["build_error"] = exc

        thread = threading.Thread(target=build, name="minivllm-kernel-build", daemon=True)
        _state["build"] = thread
        thread.start()


def _wait_for_build(path: Path) -> None:
    thread = _state.pop("build", None)
    if isinstance(thread, threading.Thread):
        thread.join()
        error = _state.pop("build_error", None)
        if error is not None:
            raise error
    if not path.exists():
        _build(path)


def available() -> bool:
    """Whether the ``minivllm_cpu`` ops are loaded (building them on first call)."""
    ok = _state.get("ok")  # the per-call check of the low-bit layers: no lock once known
    if ok is not None:
        return bool(ok)
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        ok = False
        if not envs.cpu_kernels():
            _state["ok"] = False
            return False
        try:
            path = _library_path()
            _wait_for_build(path)
            torch.ops.load_library(str(path))
            _register_fakes()
            if not envs.cpu_amx():
                torch.ops.minivllm_cpu.lowbit_amx(0)
            torch.ops.minivllm_cpu.lowbit_residual(envs.cpu_residual_cut())
            ok = True
        except Exception as e:  # noqa: BLE001 - any failure means: use torch's kernels
            logger.warning(
                "minivllm's CPU low-bit kernels are unavailable (%s); using torch's "
                "int4/int8 kernels instead (slower at small batches).",
                _first_error(e),
            )
        _state["ok"] = ok
        return ok


def _first_error(e: Exception) -> str:
    """What to tell of a failed build or load: the message, with the compiler's first
    ``error:`` line when there is one (its output follows the message's first line)."""
    lines = str(e).splitlines()
    if not lines:
        return type(e).__name__
    first_error = next((line.strip() for line in lines[1:] if "error" in line), None)
    return f"{lines[0]} {first_error}" if first_error else lines[0]


def install_block_cache(limit_bytes: int) -> bool:
    """Make CPU tensors of 16 MiB and up reuse freed blocks of their size, keeping at
    most ``limit_bytes`` cached (``block_cache_cpu.cpp``: glibc maps and unmaps every
    block over 32 MiB, so a large vocabulary's per-step logits faulted their pages in
    anew at every step).  False when the kernels are unavailable or ``limit_bytes``
    is 0."""
    if limit_bytes <= 0 or not available():
        return False
    return bool(torch.ops.minivllm_cpu.install_block_cache(limit_bytes))


def block_cache_stats() -> dict[str, int]:
    """The block cache's cached bytes, blocks reused, blocks made, blocks in use and
    limit (0: never installed in this process)."""
    cached, hits, misses, live, limit = torch.ops.minivllm_cpu.block_cache_stats()
    return {
        "cached_bytes": cached,
        "reused": hits,
        "made": misses,
        "in_use": live,
        "limit_bytes": limit,
    }


def isa(force: int = -1) -> int:
    """The kernels' code path (see the module docstring); ``force`` sets a lower one."""
    return int(torch.ops.minivllm_cpu.lowbit_isa(force))


def amx(force: int = -1) -> bool:
    """Whether q4 GEMMs of 8 tokens or more run on AMX tiles; ``force`` 0 / 1 turns
    that off / on (on only where the CPU has AMX)."""
    return bool(torch.ops.minivllm_cpu.lowbit_amx(force))


DEFAULT_PREFETCH = 2048
"""The kernels' software prefetch distance (bytes) for weights in 4 KiB pages."""


def prefetch(ahead: int = -1) -> int:
    """How far ahead (bytes) the q4 and tiled q8 kernels prefetch the weights they
    stream in one-token products (a batch-1 decode step); ``ahead`` >= 0 sets it
    (0: none).  Weights in 4 KiB pages need it (`DEFAULT_PREFETCH`); on huge pages
    the hardware prefetchers do better alone (`minivllm.worker.weight_pages`).
    Products of more tokens always prefetch `DEFAULT_PREFETCH` ahead.  One setting
    per process."""
    return int(torch.ops.minivllm_cpu.lowbit_prefetch(ahead))


DEFAULT_RESIDUAL_CUT = 0.0
"""The kernels' default `residual_cut`: a second term in every group."""

FAST_RESIDUAL_CUT = 3e-5
"""A measured opt-in cut (lowbit_kernels.h): about half the groups keep their second
term; decode steps of 16-32 rows 1.1-1.14x faster, top-1 agreement 98.3-98.5%."""


def residual_cut(cut: float = -1.0) -> float:
    """Which activation groups get the second int8 term (what the first one's rounding
    left): those whose remainder's energy exceeds ``cut`` times the token's mean energy
    per group.  ``cut`` >= 0 sets it (0, the default: every group, as exact as two
    terms go); returns the value in use.  One setting per process
    (``MINIVLLM_CPU_RESIDUAL_CUT`` sets it when the kernels load, here at the latest)."""
    if not available():
        raise RuntimeError("minivllm's CPU low-bit kernels are not available here")
    return float(torch.ops.minivllm_cpu.lowbit_residual(cut))


def _tile_codes(q: torch.Tensor, planes: int) -> torch.Tensor:
    """Codes ``q [N, K]`` in ``q4_gemm``'s tiles, then ``planes`` planes of their
    bits 4 (fifth) and 5 (sixth) (layout in lowbit_kernels.h)."""
    n, k = q.shape
    low = (q & 0x0F).view(n // ROW_TILE, ROW_TILE, k // 8, 2, 4)
    # [tile, input octet, row, 4]: low nibble = first four inputs, high = next four.
    codes = (low[:, :, :, 0] | (low[:, :, :, 1] << 4)).permute(0, 2, 1, 3).contiguous()
    out = [codes.view(-1)]
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32)
    for bit in range(4, 4 + planes):
        # [tile, input octet, nibble (low / high), row, 4]: bit 4 row + j of each 64-bit mask.
        bits = ((q >> bit) & 1).view(n // ROW_TILE, ROW_TILE, k // 8, 2, 4).permute(0, 2, 3, 1, 4)
        out.append((bits.reshape(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8))
    return torch.cat(out)


def _per_tile(values: torch.Tensor) -> torch.Tensor:
    """``[N, G, ...]`` per row as ``[N / 16, G, ..., 16]``: a tile's 16 rows side by side."""
    n = values.shape[0]
    tiled = values.view(n // ROW_TILE, ROW_TILE, *values.shape[1:])
    return tiled.movedim(1, -1).contiguous()


def pack_q8_tiles(w8: torch.Tensor) -> torch.Tensor:
    """Row-major int8 codes ``[n, k]`` (n a multiple of 16, k of 4) as the q8 tiles of
    lowbit_kernels.h, uint8 ``[n / 16, k / 4, 64]``: in tile t, step c, byte 4 r + j is
    row 16 t + r's code for input 4 c + j plus 128 (one copy; the sign flipped in place)."""
    n, k = w8.shape
    tiled = w8.view(n // ROW_TILE, ROW_TILE, k // 4, 4).transpose(1, 2).contiguous()
    return tiled.view(torch.uint8).bitwise_xor_(0x80).view(n // ROW_TILE, k // 4, 64)


def unpack_q8_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """`pack_q8_tiles` undone: the int8 codes ``[n, k]``, row-major."""
    t, steps, _ = tiles.shape
    codes = (tiles ^ 0x80).view(torch.int8).view(t, steps, ROW_TILE, 4)
    return codes.transpose(1, 2).reshape(t * ROW_TILE, steps * 4)


def pack_q4(
    q: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile codes ``q [N, K]`` with ``w = q * scale + mn`` per 32 inputs (``scale``,
    ``mn``: ``[N, K / 32]``) into ``q4_gemm``'s layout: ``(uint8 tiles, float16
    scales)`` (the pair form, q4_scales.h).  ``N`` must be a multiple of 16 and
    ``K`` of 32.  Codes 0..15 give a q4 weight (``N K / 2`` bytes); with any code
    above 15 (up to 31) the tiles hold the low four bits and the fifth bits' plane
    follows them (q5: ``N K / 2 + N K / 8`` bytes, layout in lowbit_kernels.h)."""
    q = q.to(torch.uint8)
    sm = _per_tile(torch.stack([scale, mn], dim=2).to(torch.float16))
    return _tile_codes(q, int(bool((q > 15).any()))), sm.view(-1)


def pack_q4_offset(
    q: torch.Tensor, d: torch.Tensor, five: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0 / Q5_0 in ``q4_gemm``'s offset form: ``w = (q - bias) d`` with bias 8
    (``five`` false) or 16 (true; the plane is kept even if no code needs it).
    ``d`` is float16 ``[N, K / 32]``, the file's own; the scales come back as
    ``[N, K / 32]`` (that shape names the form)."""
    q = q.to(torch.uint8)
    n, k = q.shape
    return _tile_codes(q, int(five)), _per_tile(d.to(torch.float16)).view(n, k // Q4_GROUP)


def pack_q4_super(
    q: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K in ``q4_gemm``'s super-block form: ``w = d sc q - dmin m`` with
    float16 ``d``, ``dmin`` ``[N, K / 256]`` and 6-bit ``sc``, ``m`` ``[N, K / 32]``
    (the file's values).  The scales come back as uint8 ``[N, K / 16]``: per tile and
    256 inputs, the 256 bytes q4_scales.h lays out."""
    q = q.to(torch.uint8)
    n, k = q.shape
    supers = k // 256
    dd = _per_tile(torch.stack([d, -dmin], dim=2).to(torch.float16))  # [T, S, 2, 16]
    sc = sc.to(torch.uint8).view(n, supers, 8)
    m = m.to(torch.uint8).view(n, supers, 8)
    low = _per_tile((sc & 15) | ((m & 15) << 4))  # [T, S, 8, 16]
    high = _per_tile((sc >> 4) | ((m >> 4) << 2))  # [T, S, 8, 16], a nibble a row
    high = high[..., 0::2] | (high[..., 1::2] << 4)  # [T, S, 8, 8]
    tiles = n // ROW_TILE
    block = torch.cat(
        [
            dd.view(torch.uint8).view(tiles, supers, 64),
            low.view(tiles, supers, 128),
            high.view(tiles, supers, 64),
        ],
        dim=2,
    )
    return _tile_codes(q, int(bool((q > 15).any()))), block.view(n, k // 16)


def pack_q6(
    q: torch.Tensor, d: torch.Tensor, sc: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K in ``q4_gemm``'s six form: ``w = d sc (q - 32)`` with codes ``q`` in
    0..63, float16 ``d`` ``[N, K / 256]`` and int8 ``sc`` ``[N, K / 16]`` (the file's
    values).  The codes come back as the tiles plus both bit planes (``3 N K / 4``
    bytes), the scales as int8 ``[N, 18 K / 256]``: per tile and 256 inputs, 16
    float16 d then 16 x 16 int8 sc (q4_scales.h)."""
    q = q.to(torch.uint8)
    n, k = q.shape
    supers, tiles = k // 256, n // ROW_TILE
    dd = _per_tile(d.to(torch.float16).view(n, supers, 1))  # [T, S, 1, 16]
    ss = _per_tile(sc.to(torch.int8).view(n, supers, 16))  # [T, S, 16, 16]
    block = torch.cat(
        [
            dd.view(torch.uint8).view(tiles, supers, 32),
            ss.view(torch.uint8).view(tiles, supers, 256),
        ],
        dim=2,
    )
    return _tile_codes(q, 2), block.view(torch.int8).view(n, supers * 18)


def _scale_bits(scales: torch.Tensor) -> int:
    return scales.numel() * scales.element_size() * 8


PAIR, OFFSET, SUPER, SIX = 0, 1, 2, 3
"""The scale forms of a q4-tiled weight (q4_scales.h), as the stacked header names them."""


def q4_form(scales: torch.Tensor, inputs: int) -> int:
    """The form of one q4-tiled weight's ``scales`` (q4_weight.h: their dtype and shape)."""
    if scales.dtype == torch.int8:
        return SIX
    if scales.dtype == torch.uint8:
        return SUPER
    return OFFSET if scales.dim() == 2 and scales.shape[1] * Q4_GROUP == inputs else PAIR


def pack_q4_stack(
    segments: list[tuple[torch.Tensor, torch.Tensor]], inputs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q4-tiled weights ``(codes, scales)`` of any forms, stacked on their rows as one
    weight: the codes one after another (``[N, ...]``, zeros after them to whole
    rows), the scales an int32 ``[N, ...]`` tensor of a header (q4_weight.h) and each
    segment's scale bytes, 64-byte aligned."""
    header = [len(segments), inputs, 0, 0]
    at = -(-4 * (4 + 8 * len(segments)) // 64) * 64  # the first segment's scale bytes
    code_at, rows, blobs = 0, 0, []
    for codes, scales in segments:
        raw = scales.contiguous().view(-1).view(torch.uint8)
        n = q4_outputs(inputs, scales)
        header += [n, q4_form(scales, inputs), code_at, codes.numel(), at, raw.numel(), 0, 0]
        blobs.append((at, raw))
        code_at += codes.numel()
        rows += n
        at = -(-(at + raw.numel()) // 64) * 64
    size = -(-at // (4 * rows)) * 4 * rows  # whole int32 rows of N
    blob = torch.zeros(size, dtype=torch.uint8)
    blob[: 4 * len(header)] = torch.tensor(header, dtype=torch.int32).view(torch.uint8)
    for start, raw in blobs:
        blob[start : start + raw.numel()] = raw
    codes = torch.cat([c.reshape(-1) for c, _ in segments])
    codes = torch.cat([codes, codes.new_zeros(-codes.numel() % rows)])  # whole rows
    return codes.view(rows, -1), blob.view(torch.int32).view(rows, -1)


def q4_inputs(qweight: torch.Tensor, scales: torch.Tensor) -> int:
    """The input count K of a q4-tiled weight ``qweight [N, bytes a row]``: its scales
    hold one bit per weight in the pair form, half a bit in the others (q4_scales.h),
    and its codes K / 2 or (with a plane) 5 K / 8 bytes a row, which tells the two apart."""
    rows = qweight.shape[0]
    if scales.dtype == torch.int32:  # stacked: its header holds K
        return int(scales.view(-1)[1])
    if scales.dtype == torch.int8:  # six: 18 bytes a row per 256 inputs
        return scales.numel() // rows // 18 * 256
    per_row = qweight.numel() // rows
    for k in (2 * _scale_bits(scales) // rows, _scale_bits(scales) // rows):
        if per_row in (k // 2, k * 5 // 8):
            return k
    raise ValueError(f"q4 weight of {tuple(qweight.shape)} does not match its scales")


def q4_outputs(inputs: int, scales: torch.Tensor) -> int:
    """The output count N of a q4-tiled weight of ``inputs`` inputs: float16
    ``[N, inputs / 32]`` scales are the offset form, uint8 the super form (half a bit
    a weight), other float16 the pair form (one bit a weight), as the kernels read them."""
    if scales.dtype == torch.int32:  # stacked: [N, ...]
        return scales.shape[0]
    if scales.dtype == torch.int8:  # six: 18 bytes a row per 256 inputs
        return scales.numel() // (inputs // 256 * 18)
    offset = scales.dim() == 2 and scales.shape[1] * Q4_GROUP == inputs
    half = offset or scales.dtype == torch.uint8
    return _scale_bits(scales) * (2 if half else 1) // inputs


__all__ = [
    "Q4_GROUP",
    "Q8_GROUP",
    "ROW_TILE",
    "available",
    "amx",
    "prefetch",
    "residual_cut",
    "block_cache_stats",
    "install_block_cache",
    "isa",
    "pack_q4",
    "pack_q4_offset",
    "pack_q4_super",
    "pack_q6",
    "pack_q8_tiles",
    "pack_q4_stack",
    "q4_form",
    "q4_inputs",
    "q4_outputs",
    "start_building",
    "unpack_q8_tiles",
]
