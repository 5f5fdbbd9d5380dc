"""Resident memory of an engine against the size of its GGUF file (issue 25: <= 1.3x).

Each model runs in a fresh child process, which reads its own ``/proc/self/status``
three times: after importing torch and minivllm (the baseline), after ``LLM(...)``
(the defaults a user gets: low-bit path, -O2, the CPU decode graph) and after a
short generation (4 prompts x 64 tokens, batched).  The KV cache is fixed at
``--kv-mib`` so that it does not stand in for the weights; it is reported apart:
its size and the part of it that is resident (``mincore``: pages a request wrote;
the rest of the reservation is never touched and costs nothing).
Prints per model: the file's size; resident set (anonymous + file-backed) at each
point; the growth over the baseline less the KV cache's resident pages, as a
multiple of the file (the figure the issue caps); the part of that growth that is
importing torch.compile's own modules (Dynamo and Inductor: a fixed cost of the
compiled modes, whatever the model); and the bytes of the model's own tensors (parameters
and buffers, each storage once) as a multiple of the file, those in memory of their
own apart from those that map the file itself (read on demand, resident only where
touched: the lookup table).

    python benchmarks/memory.py
    python benchmarks/memory.py --model some.gguf
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20


def status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def file_mappings(path: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of the file ``path``."""
    target = os.path.realpath(path)
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.realpath(fields[5]) == target:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((lo, hi))
    return ranges


def resident_bytes(ptr: int, nbytes: int) -> int:
    """Bytes of the pages of ``[ptr, ptr + nbytes)`` that are in memory (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    lo, hi = ptr // page * page, -(-(ptr + nbytes) // page) * page
    vec = ctypes.create_string_buffer((hi - lo) // page)
    if libc.mincore(ctypes.c_void_p(lo), hi - lo, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in vec.raw) * page


def tensor_bytes(module, path: str) -> tuple[int, int]:  # noqa: ANN001
    """Bytes of the module's parameters and buffers, each storage counted once: those
    in memory of their own, and those that are mappings of the model file (its pages,
    read on demand: the embedding table and an LM head's exact rows)."""
    mapped = file_mappings(path)
    storages = {}
    for t in [*module.parameters(), *module.buffers()]:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    in_file = sum(n for p, n in storages.items() if any(lo <= p < hi for lo, hi in mapped))
    return sum(storages.values()) - in_file, in_file


def child(path: str, kv_mib: int) -> None:
    import torch  # noqa: F401

    from minivllm import LLM, SamplingParams

    base = status()
    try:  # what the engine imports first; measured apart
        from minivllm.kernels.torch_compiler import import_torch_compiler
    except ImportError:  # a tree from before it (A/B runs with PYTHONPATH)
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    else:
        import_torch_compiler()
    compiler = status()["VmRSS"] - base["VmRSS"]
    llm = LLM(model=path, kv_cache_memory_bytes=kv_mib * MiB, max_model_len=1024)
    loaded = status()
    runner = llm.llm_engine.executor.worker.model_runner
    prompts = [
        {"prompt_token_ids": [(11 * i + 7 * j) % 1000 + 10 for j in range(64)]} for i in range(4)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    generated = status()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in runner.kv_caches}
    kv = sum(s.nbytes() for s in storages.values())
    kv_resident = sum(resident_bytes(p, s.nbytes()) for p, s in storages.items())
    own, in_file = tensor_bytes(runner.model, path)
    report = dict(
        base=base, loaded=loaded, generated=generated, kv=kv, kv_resident=kv_resident,
        compiler=compiler, tensors=own, mapped=in_file,
    )  # fmt: skip
    print("MEMORY " + json.dumps(report), flush=True)


def measure(path: Path, kv_mib: int) -> dict:
    cmd = [sys.executable, __file__, "--child", str(path), "--kv-mib", str(kv_mib)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("MEMORY "))
    return json.loads(line.removeprefix("MEMORY "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a GGUF file (repeatable; default: shipped)")
    ap.add_argument("--kv-mib", type=int, default=256, help="KV cache size (kv_cache_memory_bytes)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.kv_mib)
    sys.path.insert(0, str(Path(__file__).parent))
    from accuracy import shipped_models

    models = [Path(m) for m in args.model] if args.model else shipped_models()
    print(f"{'model':34} {'file':>7} {'base':>7} {'loaded':>7} {'gen':>7} {'anon':>7} "
          f"{'file-b':>7} {'kv':>5} {'kv-res':>6} {'growth/file':>11} {'compiler':>8} "
          f"{'tensors/file':>12} {'mapped/file':>11}  (MiB)")  # fmt: skip
    for path in models:
        r = measure(path, args.kv_mib)
        size = path.stat().st_size
        base, gen = r["base"], r["generated"]
        growth = gen["VmRSS"] - base["VmRSS"] - r["kv_resident"]
        print(
            f"{path.name:34} {size / MiB:>7.1f} {base['VmRSS'] / MiB:>7.1f} "
            f"{r['loaded']['VmRSS'] / MiB:>7.1f} {gen['VmRSS'] / MiB:>7.1f} "
            f"{(gen['RssAnon'] - base['RssAnon']) / MiB:>7.1f} "
            f"{(gen['RssFile'] - base['RssFile']) / MiB:>7.1f} {r['kv'] / MiB:>5.0f} "
            f"{r['kv_resident'] / MiB:>6.1f} {growth / size:>11.2f} {r['compiler'] / MiB:>8.1f} "
            f"{r['tensors'] / size:>12.2f} {r['mapped'] / size:>11.2f}",
            flush=True,
        )
    print("load " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
