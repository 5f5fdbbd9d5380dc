"""``minivllm serve --kv-offloading-size`` with a disk tier: a restarted server loads
the prefixes the first one computed (slow: it starts the server twice; the same
behaviour is tested in-process in test_offloading_connector.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_utils import MODEL_NAME, RemoteServer

PROMPTS = [f"Question {i}: tell me about the number {i} and its properties. " * 6 for i in range(4)]


def _serve(disk: Path) -> RemoteServer:
    extra = json.dumps({"kv_connector_extra_config": {"disk_path": str(disk)}})
    server = RemoteServer("--kv-offloading-size", "0.5", "--kv-transfer-config", extra,
                          max_model_len=512, num_gpu_blocks=64)  # fmt: skip
    server.wait_ready()
    return server


def _texts(server: RemoteServer) -> list[str]:
    body = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0}
    return [
        httpx.post(f"{server.url}/v1/completions", json={**body, "prompt": p}, timeout=120).json()[
            "choices"
        ][0]["text"]
        for p in PROMPTS
    ]


@pytest.mark.slow
def test_restarted_server_hits_the_disk_tier(tmp_path: Path) -> None:
    first = _serve(tmp_path)
    try:
        expected = _texts(first)
        computed_first = first.metric("vllm:prompt_tokens_by_source_total", source="local_compute")
    finally:
        first.stop()
    again = _serve(tmp_path)
    try:
        assert _texts(again) == expected
        computed = again.metric("vllm:prompt_tokens_by_source_total", source="local_compute")
        loaded = again.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        assert computed <= 0.2 * computed_first and loaded > 0
        assert again.metric("vllm:kv_connector_loaded_blocks_total") > 0
    finally:
        again.stop()
