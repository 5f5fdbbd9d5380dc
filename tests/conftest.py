"""Shared pytest set-up: GPU tests skip where no CUDA device exists; caches go to a tmp dir."""

from __future__ import annotations

import os

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
