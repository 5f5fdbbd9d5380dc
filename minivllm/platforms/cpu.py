"""The CPU platform: eager or torch.compile, never static graphs."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from minivllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


def usable_cpu_cores() -> int:
    """Cores this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - not Linux


def cpu_threads_per_rank(world_size: int) -> int:
    """Torch threads of each of ``world_size`` ranks on CPU: ``MINIVLLM_CPU_THREADS``
    (or the usable cores) split evenly, at least one.  The one place this is decided:
    executors pass each rank its share, a one-process worker takes the whole."""
    from minivllm import envs

    return max(1, (envs.cpu_threads() or usable_cpu_cores()) // world_size)


def data_parallel_cpu_sets(num_replicas: int) -> tuple[list[list[int] | None], int, str | None]:
    """How ``num_replicas`` data-parallel replicas of one machine share its cores:
    (the cores each replica is pinned to, or None where the OS has no affinity;
    torch threads per replica; a warning when there are more replicas than cores).

    Each replica gets an equal run of the usable cores and ``MINIVLLM_CPU_THREADS``
    (or the usable cores) split evenly; with more replicas than cores each still
    gets one thread, and replicas share cores round-robin."""
    from minivllm import envs

    threads = max(1, (envs.cpu_threads() or usable_cpu_cores()) // num_replicas)
    if not hasattr(os, "sched_getaffinity"):  # pragma: no cover - not Linux
        return [None] * num_replicas, threads, None
    cores = sorted(os.sched_getaffinity(0))
    if num_replicas > len(cores):
        warning = (
            f"data_parallel_size={num_replicas} is more than the {len(cores)} usable CPU "
            "core(s): each replica gets one thread and replicas share cores, so they "
            f"slow each other down; use -dp {len(cores)} or fewer"
        )
        return [[cores[i % len(cores)]] for i in range(num_replicas)], threads, warning
    per = len(cores) // num_replicas
    return [cores[i * per : (i + 1) * per] for i in range(num_replicas)], threads, None


def pin_to_cpus(cpus: list[int] | None) -> None:
    """Run this process (and the threads and processes it starts) on ``cpus`` only."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AMX-BF16 or AVX512-BF16).

    Elsewhere (AVX2-only or plain AVX-512 CPUs) PyTorch's bfloat16 kernels convert
    to float32 and back around every op, which is slower than float32 itself.
    torch's own check (via cpuinfo, which also asks whether the OS enabled the
    registers) comes first; /proc/cpuinfo's flags are the fallback.
    """
    import torch

    checks = [getattr(torch.cpu, name, None) for name in BF16_TORCH_CHECKS]
    if all(callable(check) for check in checks):
        return any(check() for check in checks)  # type: ignore[misc]
    try:
        with open("/proc/cpuinfo") as f:
            return cpuinfo_has_native_bf16(f.read())
    except OSError:  # not Linux
        return False


@functools.cache
def cpu_has_fast_int8_matmul() -> bool:
    """Whether oneDNN multiplies int8 by int8 fast here (``torch._int_mm``): with
    AVX512-VNNI or AMX-INT8.  Without them (AVX2-only CPUs) signed int8 x int8 falls
    to a slow path: on an AVX2 EPYC, 16-64 rows by 576 x 49152 took 6-11x a float32 GEMM."""
    try:
        with open("/proc/cpuinfo") as f:
            return cpuinfo_has_fast_int8(f.read())
    except OSError:  # not Linux
        return False


def cpuinfo_has_fast_int8(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo text lists ``avx512_vnni`` or ``amx_int8``."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[-1].split()
            return "avx512_vnni" in flags or "amx_int8" in flags
    return False


BF16_TORCH_CHECKS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
"""The ``torch.cpu`` predicates `cpu_has_native_bf16` asks (AMX tiles come with AMX-BF16)."""


def cpuinfo_has_native_bf16(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo text lists ``amx_bf16`` or ``avx512_bf16``."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[-1].split()
            return "amx_bf16" in flags or "avx512_bf16" in flags
    return False


class CpuPlatform(Platform):
    """Runs models on the host CPU.

    There is no static graph mode here, so `VllmConfig` resolves every
    ``cudagraph_mode`` to NONE on this platform; torch.compile (VLLM_COMPILE with
    Inductor) still works.
    """

    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"

    def support_hybrid_kv_cache(self) -> bool:
        """minivllm's KV cache groups (sliding-window layers freeing blocks) are plain
        bookkeeping plus the CPU attention backend's windows: supported here."""
        return True

    def check_and_update_config(self, vllm_config: VllmConfig) -> None:
        super().check_and_update_config(vllm_config)
        device_type = vllm_config.device_config.device_type
        if device_type not in ("", "cpu"):  # "" until DeviceConfig resolves "auto"
            raise ValueError(
                f"device {device_type!r} was requested but the current platform is the CPU; "
                "use --device cpu (or auto), or run on a machine with that device."
            )
        model_config = vllm_config.model_config
        # Cascade attention is a GPU kernel optimisation; the CPU attention backend
        # has no cascade path, so never plan for one.
        if model_config is not None and not model_config.disable_cascade_attn:
            model_config.disable_cascade_attn = True
