"""Fixtures of the bench tests: the default model's tokenizer and a real `minivllm serve`.

The server is tests/server_utils.py's RemoteServer.  Its max model length is
short (256) so that a test can send a prompt the server must reject.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from server_utils import RemoteServer

SERVER_MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def bench_server() -> Iterator[RemoteServer]:
    """A ready server for the tests of one module."""
    server = RemoteServer(max_model_len=SERVER_MAX_MODEL_LEN, num_gpu_blocks=256)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from minivllm.tokenizer import get_tokenizer
    from minivllm.transformers_utils.config import default_model_path

    return get_tokenizer(default_model_path())
