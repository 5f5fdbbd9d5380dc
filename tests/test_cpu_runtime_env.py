"""CPU runtime settings: the OpenMP wait policy set on import, and glibc's malloc
thresholds fixed by the worker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import minivllm, os; "
    "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ({}, "1000 None"),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "None PASSIVE"),
        ({"GOMP_SPINCOUNT": "300000"}, "300000 None"),
    ],
)
def test_wait_policy_default_and_user_values(user: dict[str, str], expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(user)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n")[0] == expected


FAULTS = """
import resource, sys, torch
from minivllm.kernels import lowbit_cpu
from minivllm.worker.worker import configure_cpu_malloc
print(configure_cpu_malloc())
if sys.argv[2] == "cache":
    assert lowbit_cpu.install_block_cache(256 << 20)
logits = torch.randn(32, int(sys.argv[1]))  # a batch-32 decode step's logits
def step():
    logits.to(torch.float32, copy=True).add_(1)  # what the sampler does each step
step()
faults = []
for _ in range(21):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults)[10])  # the median step: a one-off heap move may fault once
"""


def step_faults(vocab: int, mode: str = "plain") -> tuple[str, float]:
    """Whether the malloc thresholds were fixed, and the median page faults of a step
    whose logits have ``vocab`` columns (``mode`` "cache": with the block cache)."""
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, str(vocab), mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc tuning is Linux-only")
def test_fixed_malloc_thresholds_stop_per_step_page_faults() -> None:
    """A 6 MiB tensor allocated and freed every step reuses heap memory instead of
    mapping fresh pages (with glibc's defaults every step faults all its 1,536 pages in)."""
    fixed, faults = step_faults(49152)
    assert fixed == "True" and faults < 10


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc tuning is Linux-only")
def test_block_cache_stops_page_faults_past_the_mmap_threshold() -> None:
    """glibc maps every block over 32 MiB afresh, whatever its thresholds: 32 rows of
    Gemma 3's 262k-token vocabulary fault thousands of pages in at every step.  The
    workers' block cache hands the freed block back instead."""
    from minivllm.kernels import lowbit_cpu

    if not lowbit_cpu.available():
        pytest.skip("no C++ compiler here")
    assert step_faults(262144)[1] > 1000
    assert step_faults(262144, "cache")[1] < 10


WORKER_CACHE = """
from minivllm import LLM, SamplingParams
from minivllm.kernels import lowbit_cpu
llm = LLM(enforce_eager=True, max_model_len=256)
ready = lowbit_cpu.block_cache_stats()
llm.generate(["Hello"] * 4, SamplingParams(max_tokens=4), use_tqdm=False)
print(ready["limit_bytes"], ready["cached_bytes"])
"""


def test_a_cpu_worker_installs_the_block_cache_once_ready() -> None:
    """The worker installs the cache after loading (the start-up's freed conversion
    buffers go back to the system, none is held), with the limit of its environment."""
    from minivllm.kernels import lowbit_cpu

    if not lowbit_cpu.available():
        pytest.skip("no C++ compiler here")
    env = {**os.environ, "MINIVLLM_CPU_BLOCK_CACHE_MIB": "96"}
    out = subprocess.run(
        [sys.executable, "-c", WORKER_CACHE], env=env, capture_output=True, text=True, check=True
    )
    limit, cached = map(int, out.stdout.split()[-2:])
    assert limit == 96 << 20 and cached == 0


def test_block_cache_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm import envs

    monkeypatch.delenv("MINIVLLM_CPU_BLOCK_CACHE_MIB", raising=False)
    assert envs.cpu_block_cache_bytes() == 512 << 20
    monkeypatch.setenv("MINIVLLM_CPU_BLOCK_CACHE_MIB", "0")
    assert envs.cpu_block_cache_bytes() == 0
    monkeypatch.setenv("MINIVLLM_CPU_BLOCK_CACHE_MIB", "lots")
    with pytest.raises(ValueError, match="MINIVLLM_CPU_BLOCK_CACHE_MIB must be a whole number"):
        envs.cpu_block_cache_bytes()


TRIM = """
import torch
from minivllm.worker.worker import configure_cpu_malloc, trim_cpu_heap
configure_cpu_malloc()
blocks = [torch.ones(1 << 18) for _ in range(200)]  # 200 MiB of 1 MiB heap blocks
del blocks
print(trim_cpu_heap() >> 20)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim")
def test_freed_heap_goes_back_after_start_up() -> None:
    # With the fixed trim threshold up to 256 MiB of freed heap would stay resident
    # (the float temporaries of loading a GGUF file): the worker trims once.
    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) >= 150


def test_user_malloc_tuning_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm.worker.worker import configure_cpu_malloc

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert configure_cpu_malloc() is False


def test_cpu_threads_are_decided_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm.platforms.cpu import cpu_threads_per_rank, usable_cpu_cores

    monkeypatch.delenv("MINIVLLM_CPU_THREADS", raising=False)
    assert cpu_threads_per_rank(1) == usable_cpu_cores()
    monkeypatch.setenv("MINIVLLM_CPU_THREADS", "6")
    assert [cpu_threads_per_rank(n) for n in (1, 2, 4, 8)] == [6, 3, 1, 1]
    monkeypatch.setenv("MINIVLLM_CPU_THREADS", "two")
    with pytest.raises(ValueError, match="MINIVLLM_CPU_THREADS must be a whole number"):
        cpu_threads_per_rank(1)


def test_a_rank_gets_its_threads_as_an_argument_not_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from minivllm.config.vllm import VllmConfig
    from minivllm.executor.rank_worker import RankWorker

    monkeypatch.delenv("MINIVLLM_CPU_THREADS", raising=False)
    rank = RankWorker(VllmConfig(), rank=0, local_rank=0, cpu_threads=3)
    assert rank.cpu_threads == 3
    assert "MINIVLLM_CPU_THREADS" not in os.environ
