"""Fixtures of the compilation tests (helpers live in compile_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from compile_helpers import save_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random 2-layer Llama (float32)."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def one_layer_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random 1-layer Llama: the Inductor tests compile only two pieces of it."""
    return save_tiny_llama(tmp_path_factory.mktemp("one_layer"), num_layers=1, seed=1)
