"""SIGTERM: the server stops accepting, lets running requests finish for up to
shutdown_timeout seconds, then aborts the rest and exits."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from server_utils import RemoteServer

SHUTDOWN_TIMEOUT_S = 6


def _stream(url: str, max_tokens: int, started: threading.Event, result: dict) -> None:
    body = {"prompt": "Count slowly:", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}  # fmt: skip
    text_chunks, reason = 0, None
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data: {"):
                    result["done"] = result.get("done", False) or line == "data: [DONE]"
                    continue
                choice = json.loads(line[6:])["choices"][0]
                text_chunks += 1
                started.set()
                reason = choice["finish_reason"] or reason
    except httpx.HTTPError as exc:
        result["error"] = repr(exc)
    result.update(chunks=text_chunks, reason=reason, end=time.monotonic())
    started.set()


# Slow: its own server start-up (~8 s) plus the drain.  The default run checks the same
# (a running stream finishes, one too long is aborted at --shutdown-timeout, no new
# connections while draining, exit status 0, the abort logged) on the load tests' server:
# tests/reliability/test_reliability_load.py::
# test_sigterm_drains_running_streams_aborts_at_the_deadline_and_exits_0; several served
# names: tests/reliability/test_reliability_friction.py::test_several_served_names.
@pytest.mark.slow
def test_sigterm_drains_then_aborts() -> None:
    server = RemoteServer(
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), "--served-model-name", "tiny-smol"
    )  # fmt: skip
    try:
        server.wait_ready()
        models = httpx.get(f"{server.url}/v1/models").json()["data"]  # no --api-key: open
        assert [m["id"] for m in models] == ["tiny-smol"]
        short, long = {}, {}
        threads = []
        for tokens, result in ((30, short), (2000, long)):
            started = threading.Event()
            thread = threading.Thread(target=_stream, args=(server.url, tokens, started, result))
            thread.start()
            assert started.wait(60)
            threads.append(thread)
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):  # no new connections once draining
            httpx.get(f"{server.url}/health", timeout=2)
        for thread in threads:
            thread.join(60)
        # The short request ran to its end; the long one was aborted at the deadline.
        assert short["reason"] == "length" and short["done"], short
        assert short["chunks"] >= 30 and short["end"] > sigterm_at  # it was running at SIGTERM
        assert long["reason"] == "abort" and long["done"], long
        assert SHUTDOWN_TIMEOUT_S - 0.5 <= long["end"] - sigterm_at <= SHUTDOWN_TIMEOUT_S + 10
        # A SIGTERM is a normal stop: once drained, the exit status is 0 (not -15).
        assert server.proc.wait(30) == 0
        assert "aborting 1 running request(s)" in server.output()
    finally:
        server.stop()
