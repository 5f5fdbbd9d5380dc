"""Slow request preprocessing (a heavy chat template, a huge prompt) runs off the event
loop: while it runs, /health keeps answering at once.

The server trusts request chat templates, so a request can bring a slow one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from server_utils import RemoteServer

SERVER_ARGS = ("--trust-request-chat-template",)
SLOW_TEMPLATE = (
    "{% for i in range(6000) %}{% for j in range(6000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)
"""36M empty loop turns: a couple of seconds of rendering."""


def _health_latency_during(server: RemoteServer, path: str, body: dict[str, Any]) -> float:
    """The slowest /health answer while ``body`` is being served; asserts it took long."""
    result: dict[str, Any] = {}

    def slow() -> None:
        start = time.monotonic()
        result["resp"] = httpx.post(server.url + path, json=body, timeout=120)
        result["took"] = time.monotonic() - start

    worker = threading.Thread(target=slow)
    worker.start()
    time.sleep(0.2)  # let it start
    worst = 0.0
    while worker.is_alive():
        start = time.monotonic()
        assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200
        worst = max(worst, time.monotonic() - start)
        time.sleep(0.05)
    worker.join()
    assert result["resp"].status_code == 200, result["resp"].text
    assert result["took"] > 1.0, "the request was too quick to tell anything"
    return worst


def test_slow_request_chat_template_leaves_health_answering(server: RemoteServer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": SLOW_TEMPLATE}
    assert _health_latency_during(server, "/tokenize", body) < 0.5


def test_huge_prompt_is_tokenized_off_the_event_loop(server: RemoteServer) -> None:
    body = {"prompt": "hello world, this is some text. " * 60_000}  # 1.9 MB
    assert _health_latency_during(server, "/tokenize", body) < 0.5
