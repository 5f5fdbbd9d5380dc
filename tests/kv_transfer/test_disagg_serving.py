"""Disaggregated prefill over HTTP: two ``minivllm serve`` processes on loopback (a
TcpConnector producer and consumer) behind ``minivllm disagg-proxy``.

- Greedy outputs through the proxy are the ones one instance gives, and the
  consumer's /metrics count one computed prompt token per request, the rest
  transferred.
- The producer killed after the prefill: the consumer fails that request with a
  clear error, holds no block afterwards, and serves the next request.
- The proxy's prefill request: one token, no stream, ``do_remote_decode``.
(The connector itself is tested in-process in test_tcp_connector.py; this one is
slow because it starts two servers.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from server_utils import MODEL_NAME, RemoteServer, free_port

from minivllm.entrypoints.cli.disagg_proxy import prefill_request
from minivllm.entrypoints.openai.protocol import CompletionRequest

PROMPTS = [
    "The history of the Roman empire is long and complicated. " * 5,
    "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3,
]


def test_prefill_request_asks_for_one_token_and_the_kv() -> None:
    body = {"prompt": "hi", "max_tokens": 50, "stream": True,
            "stream_options": {"include_usage": True}, "max_completion_tokens": 50}  # fmt: skip
    req = prefill_request(body)
    assert req["max_tokens"] == 1 and req["max_completion_tokens"] == 1
    assert req["stream"] is False and "stream_options" not in req
    assert req["kv_transfer_params"]["do_remote_decode"] is True
    assert body["max_tokens"] == 50 and "kv_transfer_params" not in body  # untouched


def test_kv_transfer_params_reach_the_engine() -> None:
    params = {"do_remote_prefill": True, "remote_port": 1}
    request = CompletionRequest(prompt="x", kv_transfer_params=params)
    assert request.to_sampling_params().extra_args == {"kv_transfer_params": params}
    assert CompletionRequest(prompt="x").to_sampling_params().extra_args is None


def _kv_config(role: str, port: int) -> str:
    return json.dumps({"kv_connector": "TcpConnector", "kv_role": role, "kv_port": port})


def _complete(url: str, prompt: str, **extra) -> httpx.Response:  # noqa: ANN003
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


@pytest.mark.slow
def test_proxy_producer_and_consumer() -> None:
    producer = RemoteServer("--kv-transfer-config", _kv_config("kv_producer", free_port()),
                            max_model_len=1024, num_gpu_blocks=256)  # fmt: skip
    consumer = RemoteServer("--kv-transfer-config", _kv_config("kv_consumer", free_port()),
                            max_model_len=1024, num_gpu_blocks=256)  # fmt: skip
    proxy_port = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "minivllm.entrypoints.cli", "disagg-proxy", "--port",
         str(proxy_port), "--prefiller-ports", str(producer.port), "--decoder-ports",
         str(consumer.port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
    )  # fmt: skip
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    try:
        producer.wait_ready()
        consumer.wait_ready()
        _wait_for(proxy_url)
        alone = [_complete(producer.url, p).json()["choices"][0]["text"] for p in PROMPTS]
        through = [_complete(proxy_url, p).json()["choices"][0]["text"] for p in PROMPTS]
        assert through == alone
        computed = consumer.metric("vllm:prompt_tokens_by_source_total", source="local_compute")
        transferred = consumer.metric(
            "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        )
        assert computed == len(PROMPTS) and transferred > 100
        # The producer dies after the prefill: the consumer cannot fetch the KV.
        params = _complete(producer.url, "Tell me about ships. " * 8, max_tokens=1,
                           kv_transfer_params={"do_remote_decode": True}).json()  # fmt: skip
        os.kill(producer.proc.pid, signal.SIGKILL)
        producer.proc.wait()
        failed = _complete(consumer.url, "Tell me about ships. " * 8, **params)
        assert failed.status_code == 500
        assert "KV transfer from the prefill instance" in failed.json()["error"]["message"]
        assert consumer.metric("vllm:kv_cache_usage_perc") == 0.0
        assert consumer.metric("vllm:kv_connector_failed_loads_total") == 1
        assert _complete(consumer.url, PROMPTS[0]).json()["choices"][0]["text"] == alone[0]
        gone = _complete(proxy_url, PROMPTS[0])
        assert gone.status_code == 502 and "cannot be reached" in gone.json()["error"]["message"]
    finally:
        proxy.terminate()
        proxy.wait(30)
        producer.stop()
        consumer.stop()


def _wait_for(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/v1/models", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} never answered")
