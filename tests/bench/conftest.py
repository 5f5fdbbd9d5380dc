"""Fixtures of the bench tests: the default model's tokenizer and a real `minivllm serve`.

The server follows tests/entrypoints/openai/conftest.py: a subprocess on a free port
with -O0 and a small KV cache, ready once /health answers.  Its max model length is
short (256) so that a test can send a prompt the server must reject.
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
from typing import Any

import httpx
import pytest

SERVER_MAX_MODEL_LEN = 256
STARTUP_TIMEOUT_S = 240.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BenchServer:
    """``python -m minivllm.entrypoints.cli serve`` in a subprocess, logging to a file."""

    def __init__(self) -> None:
        self.max_model_len = SERVER_MAX_MODEL_LEN
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="minivllm-bench-serve-", suffix=".log")[1])
        args = [
            sys.executable, "-m", "minivllm.entrypoints.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "-O0",
            "--num-gpu-blocks-override", "256", "--max-model-len", str(SERVER_MAX_MODEL_LEN),
            "--uvicorn-log-level", "warning",
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=os.environ)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {STARTUP_TIMEOUT_S} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def bench_server() -> Iterator[BenchServer]:
    """A ready server for the tests of one module."""
    server = BenchServer()
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
