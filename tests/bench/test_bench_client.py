"""The streaming client of ``bench serve`` against scripted HTTP answers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from minivllm.entrypoints.bench.datasets import SampleRequest
from minivllm.entrypoints.bench.serve import send_request

SAMPLE = SampleRequest(prompt="hi there", prompt_token_ids=[1, 2, 3], expected_output_len=4)


def _sse(*chunks: dict[str, Any] | str) -> bytes:
    lines = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks]
    return "".join(lines).encode()


def _send(handler: Callable[[httpx.Request], httpx.Response]) -> Any:
    async def go() -> Any:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as client:
            return await send_request(
                client,
                "http://server/v1/completions",
                {"prompt": SAMPLE.prompt},
                {},
                SAMPLE,
                time.perf_counter(),
                count_tokens=lambda text: len(text.split()),
            )

    return asyncio.run(go())


def test_completion_stream_with_usage() -> None:
    body = _sse(
        {"choices": [{"text": "one"}]},
        {"choices": [{"text": ""}]},  # an empty delta is not a token arrival
        {"choices": [{"text": " two"}]},
        {"choices": [{"text": " three", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
        "[DONE]",
    )
    r = _send(lambda request: httpx.Response(200, content=body))
    assert r.success and r.error == ""
    assert r.generated_text == "one two three"
    assert (r.prompt_len, r.output_tokens) == (7, 3)  # the server's usage wins
    assert len(r.itl) == 2 and len(r.chunk_times) == 3
    assert 0 < r.ttft <= r.latency
    assert r.tpot == (r.latency - r.ttft) / 2


def test_chat_stream_without_usage_counts_with_the_tokenizer() -> None:
    body = _sse(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "alpha beta"}}]},
        {"choices": [{"delta": {"content": " gamma"}, "finish_reason": "stop"}]},
        "[DONE]",
    )
    r = _send(lambda request: httpx.Response(200, content=body))
    assert r.success and r.generated_text == "alpha beta gamma"
    assert (r.prompt_len, r.output_tokens) == (3, 3)  # dataset length; counted words
    assert len(r.itl) == 1


def test_http_error_and_stream_error_fail_the_request() -> None:
    r = _send(lambda request: httpx.Response(400, json={"error": {"message": "too long"}}))
    assert not r.success and r.error.startswith("HTTP 400") and "too long" in r.error
    body = _sse({"choices": [{"text": "x"}]}, {"error": {"message": "engine died"}}, "[DONE]")
    r = _send(lambda request: httpx.Response(200, content=body))
    assert not r.success and "engine died" in r.error


def test_connection_error_fails_the_request() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    r = _send(refuse)
    assert not r.success and "ConnectError" in r.error
