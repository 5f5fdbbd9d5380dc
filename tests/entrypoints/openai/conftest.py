"""A real `minivllm serve` process for the OpenAI server tests (one per session).

The server runs the default model on 127.0.0.1 with a small KV cache and -O0 so it
starts in seconds; tests talk to it with the official `openai` client or httpx.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

API_KEY = "sk-minivllm-test"
MODEL_NAME = "SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 2048
STARTUP_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RemoteServer:
    """``python -m minivllm.entrypoints.cli serve ...`` in a subprocess."""

    def __init__(self, *extra_args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="minivllm-serve-", suffix=".log")[1])
        args = [
            sys.executable, "-m", "minivllm.entrypoints.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "-O0", "--num-gpu-blocks-override", "512", "--max-model-len", str(MAX_MODEL_LEN),
            "--uvicorn-log-level", "warning", *extra_args,
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ}
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {STARTUP_TIMEOUT_S} s:\n{self.output()}")

    def metric(self, name: str, **labels: str) -> float:
        """The value of the /metrics sample ``name`` whose labels include ``labels``."""
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith((name + "{", name + " ")) and all(w in line for w in wanted):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def server_process() -> Iterator[RemoteServer]:
    """The server process, started but maybe not ready (others may load meanwhile)."""
    remote = RemoteServer("--api-key", API_KEY, "--max-log-len", "50")
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
