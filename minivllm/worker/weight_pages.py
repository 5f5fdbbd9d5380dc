"""A CPU model's weights moved onto transparent huge pages (2 MiB) after loading.

A decode step reads every weight once, and on a CPU it runs at the speed that memory
is read.  From ordinary 4 KiB pages a weight stream is read well below what the
memory system gives: each page is a TLB entry to walk to, and the core's hardware
prefetchers stop at every page boundary (minivllm's kernels prefetch 2 KiB ahead in
software to make up for it).  On huge pages a stream crosses a boundary every 2 MiB.
A plain read of 400 MB with both cores of a 2-core Zen 4 VM: 18-19 GB/s from 4 KiB
pages, 35-40 GB/s from huge pages.

`place_on_huge_pages` copies every storage the model's tensors live in (its
parameters and buffers; a storage shared by several: tied tables, stacked weights)
into one anonymous mapping advised for huge pages (``MADV_HUGEPAGE``; on Linux 6.1+
also collapsed at once, ``MADV_COLLAPSE``), each copy a storage of its own as
before, and puts new tensors over the copies where the old ones were (every
parameter, buffer and plain tensor attribute of its modules, with the attributes a
loader set on them), so every later graph, packed copy and kernel binding reads the
new pages.  Where the kernel then backs the weights with huge pages, the kernels'
software prefetch is turned off for one-token products (`lowbit_cpu.prefetch`):
there it only costs (products of more tokens keep theirs).

Left where they are: tensors in pages mapped from a file (a GGUF table read as
stored: moving it would make all of it resident), and tensors not on the CPU or not
strided.  A storage that something other than the model's modules still holds after
the move (a view kept elsewhere) would stay resident twice: its bytes are counted
(`Placement`) and logged.  Nothing is moved where the kernel has huge pages off
(``/sys/kernel/mm/transparent_hugepage/enabled`` = never), off Linux, or with
``MINIVLLM_CPU_HUGE_PAGES=0``.  The values do not change (a byte copy), so neither
does any result.

One batch-1 decode step's fused layers and LM head, weights in 4 KiB pages with the
2 KiB prefetch against huge pages without it, in one process taking turns
(``python benchmarks/weight_pages.py --model FILE --prefetch 2048 0``, 2-core Zen 4,
medians of 5 rounds): SmolLM2-135M Q4_1 1.13x, Gemma 3 270M Q4_K_M 1.36x (its 262k
x 640 head 9.73 -> 6.90 ms), Qwen3-0.6B shape Q4_K_M 1.27x, Llama-1B shape Q4_K_M
1.10x (its layers' GEMMs alone 1.35x).
"""

from __future__ import annotations

import ctypes
import mmap
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from minivllm import envs
from minivllm.kernels import lowbit_cpu
from minivllm.logger import init_logger

logger = init_logger(__name__)

HUGE_PAGE = 2 << 20
"""x86-64's transparent huge page size."""
ALIGN = 64
"""Each storage starts on a cache line in the arena."""
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MADV_COLLAPSE = 25
"""Linux 6.1+: collapse a range into huge pages now, instead of on later faults."""


@dataclass
class Placement:
    """What `place_on_huge_pages` did: bytes moved, storages moved, storages left
    (file-backed or not strided), the bytes of the arena the kernel backs with huge
    pages (``AnonHugePages`` of its mapping), the bytes whose old storage something
    outside the model's parameters and buffers still holds (kept twice), and why
    nothing was moved."""

    moved_bytes: int = 0
    moved_storages: int = 0
    left_storages: int = 0
    huge_bytes: int = 0
    still_held_bytes: int = 0
    reason: str = ""


def huge_pages_mode() -> str:
    """The kernel's transparent huge page mode (always / madvise / never), or "" where
    there is none to read (not Linux, no THP)."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else ""


def _file_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process mapped from files (``/proc/self/maps``)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            path = parts[5].strip() if len(parts) > 5 else ""
            if path.startswith("/"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def _tensors_by_storage(model: nn.Module) -> dict[int, list[torch.Tensor]]:
    """Every parameter and buffer of ``model`` (each tensor object once), grouped by
    the address of the storage it lives in, with the modules' plain tensor
    attributes that share one of those storages (views of a weight kept beside it).
    Other plain attributes (a bound KV cache) are not weights and stay."""
    groups: dict[int, list[torch.Tensor]] = {}
    seen: set[int] = set()

    def add(t: torch.Tensor) -> None:
        seen.add(id(t))
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(t)

    for module in model.modules():
        for t in [*module._parameters.values(), *module._buffers.values()]:
            if t is not None and id(t) not in seen:
                add(t)
    for module in model.modules():
        for t in vars(module).values():
            if (
                isinstance(t, torch.Tensor)
                and id(t) not in seen
                and t.untyped_storage().data_ptr() in groups
            ):
                add(t)
    return groups


def _substitute(model: nn.Module, new: dict[int, torch.Tensor]) -> None:
    """Put each moved tensor where its old one was: the modules' parameters, buffers
    and plain tensor attributes.  New tensor objects rather than the old ones pointed
    elsewhere (``set_``): a view keeps its base alive, and with it the old storage."""
    for module in model.modules():
        for slots in (module._parameters, module._buffers):
            for name, t in slots.items():
                if t is not None and id(t) in new:
                    slots[name] = new[id(t)]
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and id(value) in new:
                object.__setattr__(module, name, new[id(value)])


def _movable(tensors: list[torch.Tensor], files: list[tuple[int, int]]) -> bool:
    t = tensors[0]
    if t.device.type != "cpu" or any(x.layout != torch.strided or x.is_quantized for x in tensors):
        return False
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return False
    ptr = storage.data_ptr()
    return not any(lo <= ptr < hi for lo, hi in files)


def _arena(nbytes: int, huge: bool = True) -> tuple[mmap.mmap, int]:
    """A new anonymous mapping of at least ``nbytes`` past its first 2 MiB boundary,
    advised for huge pages, or (``huge`` false: benchmarks) against them; returns
    it and that boundary's offset in it."""
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    start = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return mapping, -start % HUGE_PAGE


def _collapse(arena: torch.Tensor) -> None:
    """Ask the kernel to back the arena with huge pages now (``MADV_COLLAPSE``); a
    kernel without it (before 6.1) fills them on the faults the copy made, or later."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    span = arena.numel() // HUGE_PAGE * HUGE_PAGE
    if span:
        libc.madvise(arena.data_ptr(), span, MADV_COLLAPSE)


def mapping_fields(ptr: int) -> dict[str, str]:
    """The ``/proc/self/smaps`` entry of the mapping that holds address ``ptr``: its
    address range under ``"range"`` and each field by name (``"AnonHugePages"``,
    ``"VmFlags"``, ...); empty where there is none or no smaps to read."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head, _, rest = line.partition(" ")
                if not head.endswith(":"):  # a mapping's first line: "lo-hi perms ..."
                    if fields:
                        break
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    if lo <= ptr < hi:
                        fields["range"] = head
                elif fields:
                    fields[head[:-1]] = rest.strip()
    except OSError:
        return {}
    return fields


def _huge_bytes(arena: torch.Tensor) -> int:
    """``AnonHugePages`` of the mapping that holds ``arena``."""
    value = mapping_fields(arena.data_ptr()).get("AnonHugePages", "0 kB")
    return int(value.split()[0]) << 10


def _plan(model: nn.Module) -> tuple[list[list[torch.Tensor]], int]:
    """The storages to move (each as the tensors in it) and how many are left."""
    files = _file_ranges()
    move, left = [], 0
    for tensors in _tensors_by_storage(model).values():
        if _movable(tensors, files):
            move.append(tensors)
        else:
            left += 1
    return move, left


def _move(
    model: nn.Module, move: list[list[torch.Tensor]], huge: bool = True
) -> tuple[torch.Tensor, list]:
    """Copy each storage of ``move`` into a new arena and put new tensors over the
    copy in the old ones' places; returns the arena (as one uint8 tensor) and a weak
    reference to each old storage with its size.  Each copy is a storage of its own
    over the arena's pages, as each old one was: tensors that did not share bytes
    before do not share a storage now (compilers treat inputs that share one as
    possibly aliased)."""
    sizes = [-(-ts[0].untyped_storage().nbytes() // ALIGN) * ALIGN for ts in move]
    mapping, first = _arena(sum(sizes), huge)
    offset, old_refs, new = first, [], {}
    with torch.no_grad():
        for tensors, size in zip(move, sizes, strict=True):
            old = tensors[0].untyped_storage()
            copy = torch.frombuffer(mapping, dtype=torch.uint8, count=old.nbytes(), offset=offset)
            copy.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            storage = copy.untyped_storage()
            for t in tensors:
                moved = t.new_empty(0).set_(storage, t.storage_offset(), t.shape, t.stride())
                if isinstance(t, nn.Parameter):
                    moved = nn.Parameter(moved, t.requires_grad)
                moved.__dict__.update(t.__dict__)  # attributes set on the weight (loaders')
                new[id(t)] = moved
            old_refs.append((old._weak_ref(), old.nbytes()))
            offset += size
    _substitute(model, new)
    arena = torch.frombuffer(mapping, dtype=torch.uint8, count=offset - first, offset=first)
    return arena, old_refs


def place_on_huge_pages(model: nn.Module, huge: bool = True) -> Placement:
    """Move ``model``'s CPU weights into one huge-page arena (see the module's
    docstring); returns what was done.  Call it once loading is done, before
    anything (a LoRA manager, a compiled graph) keeps its own references to the
    weights.  ``huge`` false moves them into ordinary pages instead (for
    ``benchmarks/weight_pages.py``, which times both in one process)."""
    placement = _place(model, huge)
    _match_prefetch(placement)
    return placement


def _match_prefetch(placement: Placement) -> None:
    """Software prefetching for the kernels' one-token weight streams only where the
    weights sit in 4 KiB pages: on huge pages it only costs (the hardware prefetchers
    run on across what were page boundaries).  Qwen3-0.6B shape Q4_K_M, one token, 2-core
    Zen 4 (``benchmarks/weight_pages.py --prefetch 2048 0``): layers + LM head 17.4
    ms in 4 KiB pages with a 2 KiB prefetch, 14.5 ms on huge pages with it, 13.7
    ms on huge pages without; the Q8 head alone 1.95 / 2.02 / 1.27 ms."""
    if not lowbit_cpu.available():
        return
    on_huge = placement.moved_bytes > 0 and placement.huge_bytes >= 0.9 * placement.moved_bytes
    lowbit_cpu.prefetch(0 if on_huge else lowbit_cpu.DEFAULT_PREFETCH)


def _place(model: nn.Module, huge: bool) -> Placement:
    mode = huge_pages_mode()
    if not envs.cpu_huge_pages() and huge:
        return Placement(reason="MINIVLLM_CPU_HUGE_PAGES=0")
    if platform.system() != "Linux" or mode in ("", "never"):
        return Placement(reason=f"transparent huge pages are {mode or 'unavailable'}")
    move, left = _plan(model)
    placement = Placement(left_storages=left)
    if not move:
        return placement
    arena, old_refs = _move(model, move, huge)  # the tensors keep the mapping alive
    move.clear()  # the old tensors' last references here
    for ref, nbytes in old_refs:  # a storage something else holds stays: two copies
        placement.moved_bytes += nbytes
        placement.moved_storages += 1
        if not torch.UntypedStorage._expired(ref):
            placement.still_held_bytes += nbytes
        torch.UntypedStorage._free_weak_ref(ref)
    if huge:
        _collapse(arena)
    placement.huge_bytes = _huge_bytes(arena)
    return placement


def log_placement(placement: Placement) -> None:
    """One line on where the weights ended up."""
    if placement.reason:
        logger.info("CPU weights left in ordinary pages: %s", placement.reason)
    elif placement.moved_bytes:
        logger.info(
            "CPU weights on huge pages: %d MiB in %d storages (%d MiB of it backed by "
            "2 MiB pages now; %d storages left where they are, e.g. mapped from the file); "
            "kernel prefetch %d bytes",
            placement.moved_bytes >> 20,
            placement.moved_storages,
            placement.huge_bytes >> 20,
            placement.left_storages,
            lowbit_cpu.prefetch() if lowbit_cpu.available() else 0,
        )
    if placement.still_held_bytes:
        logger.warning(
            "%d MiB of weights are held twice: something outside the model still holds "
            "their old storage after the move to huge pages",
            placement.still_held_bytes >> 20,
        )


__all__ = [
    "Placement",
    "huge_pages_mode",
    "log_placement",
    "mapping_fields",
    "place_on_huge_pages",
]
