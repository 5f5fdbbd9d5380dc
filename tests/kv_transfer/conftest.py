"""A tiny random Llama shared by the connector tests (built once per session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from model_helpers import save_random_hf_model

    path = tmp_path_factory.mktemp("tiny-llama")
    save_random_hf_model(path, tie_word_embeddings=False)
    return str(path)
