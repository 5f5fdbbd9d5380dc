"""Shared pytest set-up: GPU tests skip where no CUDA device exists; caches go to a tmp dir."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Keep compile/weight caches of the test run away from the user's home cache,
    # but shared across the session so the GGUF is dequantized only once.
    os.environ.setdefault(
        "MINIVLLM_CACHE_ROOT", str(config.rootpath / ".pytest_cache" / "minivllm")
    )
    # Server tests run a server process next to this one on few cores: threads that
    # spin at all would slow both down, so the tests let idle threads sleep at once.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


@pytest.fixture(autouse=True, scope="module")
def _cpu_platform_outside_gpu_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """On a machine with a GPU, test modules not marked ``gpu`` still run as on CI (CPU):
    they build CPU tensors and expect the CPU platform's resolution.  Module-scoped, so
    that the modules' own module-scoped fixtures (engines built once) run under it too."""
    if request.node.get_closest_marker("gpu") is not None or not _has_cuda():
        yield
        return
    from minivllm.platforms import CpuPlatform, override_platform

    with override_platform(CpuPlatform()):
        yield


@pytest.fixture(autouse=True)
def _seeded_per_test(request: pytest.FixtureRequest) -> None:
    """Seed torch's and Python's global generators from the test's id: a test draws the
    same random inputs whichever worker runs it and whatever ran before, so a failure
    reproduces and a tolerance that passes once passes every run."""
    import random
    import zlib

    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    torch.manual_seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test (and its fixtures' finalizers), collect garbage: its
    module-scoped engines (weights and a KV cache each) may sit in reference cycles, and two
    dozen modules build one."""
    yield
    if nextitem is None or nextitem.module is not item.module:  # type: ignore[attr-defined]
        import gc

        gc.collect()
        log = os.environ.get("MINIVLLM_TEST_RSS_LOG")
        if log:
            import psutil

            rss = psutil.Process().memory_info().rss >> 20
            with open(log, "a") as f:
                f.write(f"{rss} MiB after {item.module.__name__}\n")  # type: ignore[attr-defined]


LONGEST_FILES = (
    "reliability/test_reliability_fuzz.py",
    "compilation/test_aot_compile.py",
    "compilation/test_compile_default_model.py",
    "compilation/test_decode_graph.py",
    "reliability/test_reliability_load.py",
    "engine/test_greedy_parity.py",
    "model_executor/test_gemma3.py",
    "test_readme.py",
)
"""Test files of 20 s or more on 2 cores (``--durations``), in that order."""


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Put the longest files first: with ``-n 2 --dist loadfile`` (README's command) a
    worker takes whole files in collection order, and a long file taken last runs alone
    at the end while the other worker idles."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: the order within a file, and of the rest, is kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
