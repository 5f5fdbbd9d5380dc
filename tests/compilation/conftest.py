"""Fixtures of the compilation tests (helpers live in compile_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from compile_helpers import save_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random 2-layer Llama (float32)."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
