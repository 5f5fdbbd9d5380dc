"""One server for the end-to-end reasoning tests: the tiny random reasoning model
(`reasoning_model.py`) served with ``--reasoning-parser qwen3`` and hermes tool
calls, started once for the package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reasoning_model import build_reasoning_model
from server_utils import RemoteServer


@pytest.fixture(scope="package")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reasoning_model(tmp_path_factory.mktemp("reasoning-model"))


@pytest.fixture(scope="package")
def server(model_dir: Path) -> Iterator[RemoteServer]:
    remote = RemoteServer(
        "--model", str(model_dir), "--served-model-name", "thinker",
        "--reasoning-parser", "qwen3",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        max_model_len=512, num_gpu_blocks=128,
    )  # fmt: skip
    try:
        remote.wait_ready()
        yield remote
    finally:
        remote.stop()
