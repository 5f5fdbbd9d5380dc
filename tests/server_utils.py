"""A real ``minivllm serve`` subprocess for tests that talk HTTP to a server.

Shared by the OpenAI server tests and the bench tests.  The server runs the default
model on 127.0.0.1 at a free port with -O0 and a small KV cache, so it starts in
seconds; it is ready once /health answers 200.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

DEFAULT_MAX_MODEL_LEN = 2048
MAX_MODEL_LEN = DEFAULT_MAX_MODEL_LEN
"""max_model_len of the shared OpenAI test server."""
API_KEY = "sk-minivllm-test"
"""API key of the shared OpenAI test server."""
MODEL_NAME = "SmolLM2-135M-Instruct"
"""The default model's served name."""
STARTUP_TIMEOUT_S = 240.0


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and not one this
    process handed out before (servers started together must not share one)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class RemoteServer:
    """``python -m minivllm.entrypoints.cli serve ...`` in a subprocess, logging to a file."""

    def __init__(
        self,
        *extra_args: str,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        num_gpu_blocks: int = 512,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.max_model_len = max_model_len
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="minivllm-serve-", suffix=".log")[1])
        args = [
            sys.executable, "-m", "minivllm.entrypoints.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "-O0",
            "--num-gpu-blocks-override", str(num_gpu_blocks),
            "--max-model-len", str(max_model_len),
            "--uvicorn-log-level", "warning", *extra_args,
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def wait_ready(self) -> None:
        """Block until /health answers 200; raise with the server's log if it never does."""
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
        """What the server has logged so far."""
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Terminate the server (kill it after 30 s) and delete its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.unlink(missing_ok=True)


@contextlib.contextmanager
def all_ready(servers: dict[str, RemoteServer]) -> Iterator[dict[str, RemoteServer]]:
    """Servers started together: wait until each is ready, stop them all at the end."""
    try:
        for remote in servers.values():
            remote.wait_ready()
        yield servers
    finally:
        for remote in servers.values():
            remote.stop()
