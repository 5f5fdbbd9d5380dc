"""Bounded load against one real server: 32 concurrent streams for 2 rounds with exact
token counts, a storm of clients hanging up mid-stream, and a SIGTERM drain (the
running streams finish, one too long for the shutdown timeout is aborted at it); after
each, nothing is left running or waiting and the KV cache is empty again.

The server's resident memory growth is printed (``-s`` shows it), not asserted: it
depends on the allocator, and the token-exact checks are what must hold.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import psutil
import pytest
from server_utils import RemoteServer

SHUTDOWN_TIMEOUT_S = 6
SERVER_ARGS = ("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), "--max-num-seqs", "64")
NUM_STREAMS = 32
NUM_ROUNDS = 2
MAX_TOKENS = 16


def _rss_mib(server: RemoteServer) -> float:
    return psutil.Process(server.proc.pid).memory_info().rss / (1 << 20)


def _wait_idle(server: RemoteServer, timeout: float = 30) -> None:
    """Until nothing runs or waits and the KV cache is empty (the gauges of /metrics)."""
    deadline = time.monotonic() + timeout
    gauges: dict[str, float] = {}
    while time.monotonic() < deadline:
        gauges = {name: server.metric(name) for name in (
            "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")}  # fmt: skip
        if not any(gauges.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"the server did not go idle: {gauges}")


async def _stream(
    client: httpx.AsyncClient, i: int, max_tokens: int = MAX_TOKENS, done: list[bool] | None = None
) -> tuple[int, int, str | None]:
    """(text chunks, completion_tokens of the usage chunk, finish_reason) of one stream;
    ``done`` gets whether it ended with ``data: [DONE]``."""
    body = {"prompt": f"Request {i}: tell me a story about", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.8, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks, usage, reason = 0, -1, None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if done is not None and line == "data: [DONE]":
                done.append(True)
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event["choices"]:
                chunks += 1
                reason = choice["finish_reason"] or reason
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
    return chunks, usage, reason


async def _round(url: str) -> list[tuple[int, int, str | None]]:
    limits = httpx.Limits(max_connections=NUM_STREAMS)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(_stream(client, i) for i in range(NUM_STREAMS)))


def test_concurrent_streams_get_exact_token_counts(server: RemoteServer) -> None:
    rss_before = _rss_mib(server)
    generated = server.metric("vllm:generation_tokens_total")
    start = time.monotonic()
    for round_index in range(NUM_ROUNDS):
        results = asyncio.run(_round(server.url))
        for chunks, usage, reason in results:
            assert usage == MAX_TOKENS and reason == "length", (round_index, results)
            assert chunks == MAX_TOKENS  # one token per chunk, none lost or doubled
        _wait_idle(server)
    elapsed = time.monotonic() - start
    expected = NUM_ROUNDS * NUM_STREAMS * MAX_TOKENS
    assert server.metric("vllm:generation_tokens_total") - generated == expected
    print(f"\nload: {NUM_ROUNDS} x {NUM_STREAMS} streams x {MAX_TOKENS} tokens in "
          f"{elapsed:.1f} s ({expected / elapsed:.0f} tok/s); server RSS "
          f"{rss_before:.0f} -> {_rss_mib(server):.0f} MiB")  # fmt: skip


async def _hang_up(url: str, i: int) -> None:
    body = {"prompt": f"Client {i} says", "max_tokens": 500, "ignore_eos": True,
            "stream": True, "n": 1 + i % 3, "temperature": 1.0}  # fmt: skip
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    return  # leave mid-stream: the connection closes under the server


async def _storm(url: str, num_clients: int) -> None:
    await asyncio.gather(*(_hang_up(url, i) for i in range(num_clients)))


def test_disconnect_storm_leaks_nothing(server: RemoteServer) -> None:
    aborted = server.metric("vllm:request_success_total", finished_reason="abort")
    for _ in range(2):
        asyncio.run(_storm(server.url, 48))
        _wait_idle(server)
    assert server.metric("vllm:request_success_total", finished_reason="abort") - aborted >= 90
    assert httpx.get(server.url + "/health").status_code == 200
    body = {"prompt": "After the storm", "max_tokens": 8, "ignore_eos": True}
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert resp.json()["usage"]["completion_tokens"] == 8


def test_sigterm_drains_running_streams_aborts_at_the_deadline_and_exits_0(
    server: RemoteServer,
) -> None:
    """Last in this module: it stops the server.  Eight short streams run to their end
    during the drain; a 2000-token one cannot, and is aborted at the shutdown timeout."""
    long_done: list[bool] = []

    async def timed_long(client: httpx.AsyncClient) -> tuple[tuple[int, int, str | None], float]:
        result = await _stream(client, 8, max_tokens=2000, done=long_done)
        return result, time.monotonic()

    async def run() -> tuple[list[tuple[int, int, str | None]], tuple, float, float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            tasks = [asyncio.create_task(_stream(client, i)) for i in range(8)]
            long_task = asyncio.create_task(timed_long(client))
            await asyncio.sleep(0)
            while server.metric("vllm:num_requests_running") < 9:
                await asyncio.sleep(0.05)
            sigterm_at = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient(base_url=server.url) as fresh:
                with pytest.raises(httpx.TransportError):  # no new connections once draining
                    await fresh.get("/health", timeout=2)
            results = await asyncio.gather(*tasks)
            long, long_end = await long_task
            return results, long, long_end, sigterm_at

    results, long, long_end, sigterm_at = asyncio.run(run())
    assert all(r == (MAX_TOKENS, MAX_TOKENS, "length") for r in results), results
    assert long[2] == "abort" and long[0] < 2000 and long_done, long
    assert SHUTDOWN_TIMEOUT_S - 0.5 <= long_end - sigterm_at <= SHUTDOWN_TIMEOUT_S + 10
    # A SIGTERM is a normal stop: once drained, the exit status is 0 (not -15).
    assert server.proc.wait(60) == 0, server.output()[-3000:]
    assert "aborting 1 running request(s)" in server.output()
