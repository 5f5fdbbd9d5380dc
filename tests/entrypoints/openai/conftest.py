"""A real `minivllm serve` process for the OpenAI server tests (one per session).

The server runs the default model on 127.0.0.1 with a small KV cache and -O0 so it
starts in seconds; tests talk to it with the official `openai` client or httpx.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_utils import API_KEY, RemoteServer


@pytest.fixture(scope="session")
def server_process() -> Iterator[RemoteServer]:
    """The server process, started but maybe not ready (others may load meanwhile)."""
    remote = RemoteServer(
        "--api-key", API_KEY, "--max-log-len", "50",
        # tool_choice "auto" (tests/entrypoints/openai/test_openai_tools.py)
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        # Structured JSON without free whitespace: the tiny model, given the choice,
        # pads JSON with newlines until max_tokens (test_openai_structured.py).
        "--structured-outputs-config", '{"disable_any_whitespace": true}',
        # Float weights: tests compare with offline greedy tokens, and the low-bit
        # path's outputs move slightly with how many rows a step computes.
        "--quantization", "none",
    )  # fmt: skip
    try:
        yield remote
    finally:
        remote.stop()


@pytest.fixture(scope="session")
def server(server_process: RemoteServer) -> RemoteServer:
    """The shared server, ready (/health answers 200)."""
    server_process.wait_ready()
    return server_process


@pytest.fixture(scope="session")
def tokenizer():  # noqa: ANN201
    from minivllm.tokenizer import get_tokenizer
    from minivllm.transformers_utils import config as hf_utils

    return get_tokenizer(hf_utils.default_model_path())


@pytest.fixture
def client(server: RemoteServer):  # noqa: ANN201
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def async_client(server: RemoteServer):  # noqa: ANN201
    import openai

    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
