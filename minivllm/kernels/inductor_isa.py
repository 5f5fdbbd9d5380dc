"""Inductor's vector ISA check, done once per machine instead of once per process.

Before Inductor generates or loads C++ for a CPU, it checks every vector instruction
set the CPU reports (AMX, AVX-512 VNNI, AVX-512, AVX2) by compiling small programs
with that set's flags and loading each in a child process: ten probes, ~1.4 s of
every warm start and ~8 s of a first one on a 2-core machine, for an answer that
depends only on the CPU, the compiler and torch.

`settle_vec_isa` lets Inductor check once (on a first start in the background, from
`start_checking`, while the C++ kernels build and the weights load), records the
verdict under the cache root (keyed by torch's version, the compiler binary and the
CPU's instruction sets), and when every instruction set the CPU reports passed,
tells Inductor so (``config.cpp.vec_isa_ok``, and ``TORCHINDUCTOR_VEC_ISA_OK`` for
its compile workers), which skips the check in this process, its workers and later
starts.  Inductor's config is per thread, so the verdict is applied in the thread
that compiles.  When one set failed (say a compiler too old for AMX), nothing is set
and Inductor goes on checking each time, so its choice stays its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import threading
from pathlib import Path

import torch

from minivllm.envs import cache_root
from minivllm.kernels.torch_compiler import import_torch_compiler
from minivllm.logger import init_logger

logger = init_logger(__name__)

_lock = threading.Lock()
_state: dict[str, object] = {}


def _compiler_identity() -> str:
    """Path, size and change time of the C++ compiler Inductor will run."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = get_cpp_compiler()
    path = shutil.which(compiler) or compiler
    try:
        stat = Path(path).resolve().stat()
    except OSError:
        return path
    return f"{Path(path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _verdict_path(reported: list[str]) -> Path:
    text = "|".join([torch.__version__, _compiler_identity(), *reported])
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return cache_root() / "inductor_vec_isa" / f"{key}.json"


def _trust() -> None:
    from torch._inductor import config

    config.cpp.vec_isa_ok = True
    os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"


def _applies() -> bool:
    if platform.machine() not in ("x86_64", "AMD64") or "TORCHINDUCTOR_VEC_ISA_OK" in os.environ:
        return False
    import_torch_compiler()
    from torch._inductor import config

    return config.cpp.vec_isa_ok is None


def start_checking() -> None:
    """Settle the check in a background thread (its compilers run in child processes,
    so it overlaps the rest of a start-up); `settle_vec_isa` waits for it.  Inductor's
    modules are imported here, in the caller's thread, so that no import runs in two
    threads at once."""
    with _lock:
        if _state or not _applies():
            return
        import torch._inductor.cpp_builder  # noqa: F401
        import torch._inductor.cpu_vec_isa  # noqa: F401

        def check() -> None:
            fresh: list[bool] = []
            _state["verdict"] = _verdict(fresh)
            if fresh:
                _build_prefix_header()

        thread = threading.Thread(target=check, name="minivllm-isa-check", daemon=True)
        _state["thread"] = thread
        thread.start()


def settle_vec_isa() -> bool:
    """Skip Inductor's per-process ISA check where a recorded check passed for every
    instruction set this CPU reports; returns whether it is skipped.  Idempotent;
    an explicit ``TORCHINDUCTOR_VEC_ISA_OK`` or a non-x86 machine is left alone.
    Call it from the thread that compiles: Inductor's config is per thread."""
    thread = _state.get("thread")
    if isinstance(thread, threading.Thread):
        thread.join()
    with _lock:
        if "settled" not in _state:
            trusted = False
            if _applies():
                verdict = _state.get("verdict") or _verdict()
                trusted = verdict["passed"] == verdict["reported"]
                if trusted:
                    _trust()
                else:
                    logger.info(
                        "Inductor's vector ISA check passed %s of the %s this CPU "
                        "reports; it checks again at each start",
                        verdict["passed"],
                        verdict["reported"],
                    )
            _state["settled"] = trusted
        return bool(_state["settled"])


def _build_prefix_header() -> None:
    """Compile one tiny graph, so that Inductor precompiles the C++ header every CPU
    kernel includes (~4.5 s on a 2-core machine, once per machine) while the start-up
    waits for minivllm's kernels, not later in the model's compile.  `settle_vec_isa`
    joins this thread before the model's first trace, so Dynamo never runs in two
    threads at once."""
    try:
        fn = torch.compile(_tiny_graph, backend="inductor", fullgraph=True, dynamic=False)
        fn(torch.ones(64))
    except Exception as exc:  # noqa: BLE001 - only a head start; the model compiles anyway
        logger.debug("warming Inductor's header failed: %s", exc)


def _tiny_graph(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2.0 + 1.0)


def reported_isas() -> list[str]:
    """Inductor's names of the vector instruction sets this CPU reports, best first
    (what its check would test)."""
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    return [
        str(isa)
        for isa in cpu_vec_isa.supported_vec_isa_list
        if all(flag in flags for flag in str(isa).split())
    ]


def _verdict(fresh: list[bool] | None = None) -> dict[str, list[str]]:
    """The recorded check for this CPU, compiler and torch, made (and recorded) now
    if there is none (then ``fresh`` gets an entry)."""
    from torch._inductor import cpu_vec_isa

    reported = reported_isas()
    path = _verdict_path(reported)
    try:
        verdict = json.loads(path.read_text())
        if isinstance(verdict, dict) and verdict.get("reported") == reported:
            return {"reported": reported, "passed": list(verdict.get("passed", []))}
    except (OSError, ValueError):
        pass
    passed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
    verdict = {"reported": reported, "passed": passed}
    if fresh is not None:
        fresh.append(True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(verdict))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache: check again next time
        logger.debug("could not record Inductor's ISA check: %s", exc)
    return verdict
