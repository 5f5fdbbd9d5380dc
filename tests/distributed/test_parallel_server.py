"""``minivllm serve --tensor-parallel-size 3`` on the default model: it streams, and a
killed worker process fails the in-flight request and turns /health 503 within 10 s."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from server_utils import MODEL_NAME, RemoteServer

UNHEALTHY_WITHIN_S = 10.0


def _worker_pids(server_pid: int) -> list[int]:
    """The spawned rank processes under the server (not multiprocessing's tracker)."""
    pids = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.Error:  # exited (or a zombie) since it was listed
            continue
    return pids


def _stream(url: str, max_tokens: int, events: list[str], first: threading.Event) -> None:
    body = {
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                first.set()
    first.set()


@pytest.fixture(scope="module")
def tp3_server():  # noqa: ANN201
    server = RemoteServer(
        "--tensor-parallel-size", "3", "--dtype", "float32", max_model_len=512, num_gpu_blocks=64
    )
    try:
        server.wait_ready()
        yield server
    finally:
        pids = _worker_pids(server.proc.pid) if server.proc.poll() is None else []
        server.stop()
        for pid in pids:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)


def test_tp3_server_streams_then_fails_fast_when_a_worker_dies(tp3_server: RemoteServer) -> None:
    url = tp3_server.url
    workers = _worker_pids(tp3_server.proc.pid)
    assert len(workers) == 3

    events: list[str] = []
    _stream(url, 8, events, threading.Event())
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text.strip(), events

    # A long request is streaming when one rank is killed.
    events, first = [], threading.Event()
    client = threading.Thread(target=_stream, args=(url, 400, events, first))
    client.start()
    assert first.wait(60), "the long request never started streaming"
    os.kill(workers[2], signal.SIGKILL)
    killed_at = time.monotonic()
    client.join(UNHEALTHY_WITHIN_S)
    assert not client.is_alive(), "the in-flight stream did not end after the worker died"
    assert any("error" in json.loads(e) for e in events if e != "[DONE]"), events[-3:]
    while time.monotonic() - killed_at < UNHEALTHY_WITHIN_S:
        if tp3_server.proc.poll() is not None:
            return  # exiting also counts
        if httpx.get(f"{url}/health", timeout=2).status_code == 503:
            break
        time.sleep(0.2)
    assert httpx.get(f"{url}/health", timeout=2).status_code == 503
    assert time.monotonic() - killed_at < UNHEALTHY_WITHIN_S
    # New requests are refused at once, not queued behind a dead engine.
    resp = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2},
        timeout=UNHEALTHY_WITHIN_S,
    )
    assert resp.status_code >= 500 and "error" in resp.json()
